//! A replicated pool whose OSDs fill up refuses writes with `NoSpace` before a copy's store
//! would refuse one it already gave a version to (which stops that copy): the PGs go on
//! serving, removals free space, and writes go through again.

mod common;
use common::*;

use bytes::Bytes;
use carmine_cluster::OsdMap;
use carmine_mapstore::LocalPgHistory;
use carmine_osd::{Osd, OsdConfig};
use carmine_proto::{OpOutput, OsdOp, ScrubMode, Status};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Memory stores this small fill after a few dozen objects.
const STORE_BYTES: u64 = 8 << 20;
const OBJECT: usize = 256 << 10;

fn start_small(id: u32, map: &OsdMap, histories: &Path) -> Osd {
    Osd::start(OsdConfig {
        pg_history: Some(Arc::new(LocalPgHistory::new(histories))),
        ..OsdConfig::in_memory(id, map.clone(), STORE_BYTES)
    })
    .unwrap()
}

/// Three OSDs whose stores hold `STORE_BYTES` times their factor, with leases of 400 ms (so
/// replicas answer pings, and say whether they are full, every 100 ms).
fn start_sized(map: &OsdMap, histories: &Path, factors: [u64; 3]) -> Vec<Osd> {
    (0..3)
        .map(|id| {
            Osd::start(OsdConfig {
                pg_history: Some(Arc::new(LocalPgHistory::new(histories))),
                read_lease: Duration::from_millis(400),
                ..OsdConfig::in_memory(id, map.clone(), factors[id as usize] * STORE_BYTES)
            })
            .unwrap()
        })
        .collect()
}

/// A write's answer within 20 s: a write that a copy could not store waits for good (the
/// copy stops), and the test must fail rather than hang.
async fn bounded<T>(write: impl std::future::Future<Output = T>) -> T {
    carmine_reactor::timeout(Duration::from_secs(20), write)
        .await
        .expect("a write got no answer in 20 s: a copy that could not store it holds it")
}

fn body(i: usize) -> Bytes {
    Bytes::from(vec![i as u8; OBJECT])
}

#[test]
fn a_full_replicated_pool_refuses_writes_and_serves_on() {
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("full");
    let map = three_osd_map(1);
    let osds: Vec<Option<Osd>> = (0..3)
        .map(|id| Some(start_small(id, &map, dir.path())))
        .collect();
    wait_settled(&map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        let put = |i: usize| {
            let c = &c;
            async move {
                let oid = format!("big{i}");
                let write = c.execute(1, &oid, vec![OsdOp::WriteFull { data: body(i) }]);
                bounded(write).await
            }
        };
        // Fill until refused: NoSpace, never a stopped copy.
        let mut stored = 0;
        loop {
            match put(stored).await {
                Ok(_) => stored += 1,
                Err(e) => {
                    assert_eq!(e.status(), Some(Status::NoSpace), "big{stored}: {e}");
                    break;
                }
            }
            assert!(stored < 64, "8 MiB stores took {stored} objects of 256 KiB");
        }
        eprintln!("{stored} objects of 256 KiB before the OSDs were full");
        assert!(stored >= 8, "refused far from full: after {stored} objects");
        // A conditional write is refused the same way.
        let excl = c
            .execute(
                1,
                "new",
                vec![
                    OsdOp::Create { exclusive: true },
                    OsdOp::WriteFull { data: body(99) },
                ],
            )
            .await;
        assert_eq!(excl.unwrap_err().status(), Some(Status::NoSpace));
        let refused: u64 = osds
            .iter()
            .flatten()
            .flat_map(|o| o.metrics_sources())
            .map(|r| r.metrics.writes_refused_full())
            .sum();
        assert!(
            refused >= 2,
            "{refused} writes counted as refused for space"
        );
        // Everything acknowledged reads back; removals go through and make room.
        for i in 0..stored {
            assert_eq!(c.read(1, &format!("big{i}"), 0, 0).await.unwrap(), body(i));
        }
        for i in 0..4 {
            c.execute(1, &format!("big{i}"), vec![OsdOp::Remove])
                .await
                .unwrap();
        }
        put(stored).await.expect("a write after removals made room");
        let out = c
            .execute(1, &format!("big{stored}"), vec![OsdOp::Stat])
            .await
            .unwrap();
        assert!(matches!(&out[..], [OpOutput::Stat { size, .. }] if *size == OBJECT as u64));
        // No copy stopped: every PG scrubs clean on all three.
        for seed in 0..map.pools[0].pg_num {
            let report = findings(&c, seed, 0).await;
            assert_eq!(report.acting.len(), 3, "pg {seed}: {report:?}");
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

#[test]
fn a_full_replica_is_known_to_its_primaries_which_refuse_writes_for_it() {
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("full-replica");
    let map = three_osd_map(1);
    // osd.1 has half the room of the others.
    let osds = start_sized(&map, dir.path(), [2, 1, 2]);
    wait_settled(&map, dir.path());
    const SMALL: usize = 64 << 10;
    let small = |i: usize| Bytes::from(vec![i as u8; SMALL]);
    // Only objects of PGs osd.1 is a replica of: their primaries can know it is full only
    // from its pongs.
    let pool = &map.pools[0];
    let names: Vec<String> = (0..10_000)
        .map(|i| format!("s{i}"))
        .filter(|oid| map.pg_primary(map.object_pg(pool, oid)).map(|p| p.0) != Some(1))
        .take(200)
        .collect();
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        let mut stored = 0;
        let refusal = loop {
            let put = bounded(c.execute(
                1,
                &names[stored],
                vec![OsdOp::WriteFull {
                    data: small(stored),
                }],
            ))
            .await;
            match put {
                Ok(_) => stored += 1,
                Err(e) => break e,
            }
            assert!(
                stored < names.len(),
                "{stored} objects of 64 KiB and osd.1 never full"
            );
            // Slower than its pings, so the primaries hear of it before it overflows.
            carmine_reactor::sleep(Duration::from_millis(30)).await;
        };
        assert_eq!(refusal.status(), Some(Status::NoSpace), "{refusal}");
        assert!(refusal.to_string().contains("osd.1"), "{refusal}");
        eprintln!("{stored} objects of 64 KiB, then: {refusal}");
        // No copy stopped: everything acknowledged reads back, and scrubs clean on all three.
        for (i, oid) in names[..stored].iter().enumerate() {
            assert_eq!(c.read(1, oid, 0, 0).await.unwrap(), small(i));
        }
        for seed in 0..map.pools[0].pg_num {
            let report = findings(&c, seed, 0).await;
            assert_eq!(report.acting.len(), 3, "pg {seed}: {report:?}");
        }
        // Removals make room; once osd.1 says so, writes go through again.
        for oid in &names[..stored / 2] {
            c.execute(1, oid, vec![OsdOp::Remove]).await.unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let put = c
                .execute(1, &names[0], vec![OsdOp::WriteFull { data: small(7) }])
                .await;
            match put {
                Ok(_) => break,
                Err(e) if e.status() == Some(Status::NoSpace) => {
                    assert!(std::time::Instant::now() < deadline, "{e}");
                    carmine_reactor::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
    });
    for o in osds {
        o.shutdown().unwrap();
    }
}

/// A replica whose store has no room for a write its primary already gave a version to (the
/// write came before its pong said full) does not hold the PG up: its copy stops, restarts
/// from its store, takes the PG's history with that object missing, and the write is
/// acknowledged by the three copies' logs. The store then counts as full, so writes are
/// refused with `NoSpace`; once removals free room, the object is recovered and every copy
/// scrubs clean.
#[test]
fn a_replica_without_room_for_a_write_restarts_its_copy_and_the_pg_serves_on() {
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("full-overflow");
    let map = three_osd_map(1);
    // osd.1 has a quarter of the others' room, and objects are big: the write that
    // overflows it leaves no time for a pong to warn its primary.
    let osds = start_sized(&map, dir.path(), [4, 1, 4]);
    wait_settled(&map, dir.path());
    const BIG: usize = 1 << 20;
    let big = |i: usize| Bytes::from(vec![i as u8 + 1; BIG]);
    let pool = &map.pools[0];
    let names: Vec<String> = (0..10_000)
        .map(|i| format!("o{i}"))
        .filter(|oid| map.pg_primary(map.object_pg(pool, oid)).map(|p| p.0) != Some(1))
        .take(32)
        .collect();
    let restarts = |osds: &[Osd]| -> u64 {
        osds.iter()
            .flat_map(|o| o.metrics_sources())
            .map(|r| r.metrics.pg_copies_stopped())
            .sum()
    };
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        let mut stored = 0;
        let refusal = loop {
            let put = bounded(c.execute(
                1,
                &names[stored],
                vec![OsdOp::WriteFull { data: big(stored) }],
            ))
            .await;
            match put {
                Ok(_) => stored += 1,
                Err(e) => break e,
            }
            assert!(stored < names.len(), "8 MiB took {stored} objects of 1 MiB");
        };
        assert_eq!(refusal.status(), Some(Status::NoSpace), "{refusal}");
        eprintln!("{stored} objects of 1 MiB, then: {refusal}");
        assert!(
            restarts(&osds) >= 1,
            "osd.1 was warned in time: this test needs a write it has no room for"
        );
        assert!(
            stored >= 7,
            "refused early: after {stored} objects of 1 MiB"
        );
        let refused_room = |osds: &[Osd]| {
            osds[1]
                .metrics_sources()
                .iter()
                .any(|r| r.metrics.store_refused_room())
        };
        assert!(
            refused_room(&osds),
            "osd.1 does not say it refused a write for room"
        );
        // Everything acknowledged reads back, the object osd.1 lacks too (from its primary).
        for (i, oid) in names[..stored].iter().enumerate() {
            assert_eq!(c.read(1, oid, 0, 0).await.unwrap(), big(i), "{oid}");
        }
        // Removals go through and make room; writes are taken again once osd.1 says so, and
        // the object it lacked is recovered.
        for oid in &names[..stored / 2] {
            bounded(c.execute(1, oid, vec![OsdOp::Remove]))
                .await
                .unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let put = bounded(c.execute(1, &names[0], vec![OsdOp::WriteFull { data: big(0) }]));
            match put.await {
                Ok(_) => break,
                Err(e) if e.status() == Some(Status::NoSpace) => {
                    assert!(std::time::Instant::now() < deadline, "{e}");
                    carmine_reactor::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
        for seed in 0..map.pools[0].pg_num {
            loop {
                // Refused, or with findings, while osd.1 still lacks the object.
                let r = c.scrub(1, seed, ScrubMode::Deep).await;
                if r.as_ref()
                    .is_ok_and(|r| r.findings_total == 0 && r.acting.len() == 3)
                {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "pg {seed} never scrubbed clean: {r:#?}"
                );
                carmine_reactor::sleep(Duration::from_millis(100)).await;
            }
        }
        assert!(!refused_room(&osds), "osd.1 still says it is out of room");
        let lacking: u64 = osds
            .iter()
            .flat_map(|o| o.metrics_sources())
            .map(|r| r.metrics.objects_to_recover())
            .sum();
        assert_eq!(lacking, 0, "objects still to recover");
    });
    for o in osds {
        o.shutdown().unwrap();
    }
}
