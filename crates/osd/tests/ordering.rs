//! One client's writes to one object apply in the order it sent them, whatever held the
//! first of them back and whatever the next found when it came. (The same line orders writes
//! held by a scrub chunk and by a conditional write at the gate; `conditional.rs` and
//! `replication.rs` run those.)

mod common;
use common::*;

use bytes::Bytes;
use carmine_cluster::OsdMap;
use carmine_osd::{Osd, OsdConfig, RecoveryConfig};
use carmine_proto::{OpOutput, OsdOp};
use std::time::Duration;

/// Each object below is first written while the copy that came back empty still lacks it,
/// so that write waits for its recovery; a second write to it follows a little later, after
/// the object came back or not. The object must end with the second one's data, whatever
/// the gap. (A write that waited looked again only every few milliseconds, and a write that
/// came meanwhile, finding the object whole, went ahead of it: the object kept the first.)
#[test]
fn a_write_that_waits_for_its_object_to_be_recovered_is_not_overtaken() {
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("ordering-recovery");
    let mut map = three_osd_map(1);
    // Slow enough that every object is still lacking when its turn comes (the writes fetch
    // theirs first, whatever the rate).
    let slow = RecoveryConfig {
        rate: Some(256 << 10),
        busy_rate: None,
        ..Default::default()
    };
    let start = |id: u32, map: &OsdMap| {
        start_recovering(id, map, dir.path(), None, Default::default(), slow)
    };
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map))).collect();
    wait_settled(&map, dir.path());
    const N: usize = 48;
    let obj = |i: usize| format!("ordered{i}");
    let first = Bytes::from(vec![1u8; 4096]);
    let second = Bytes::from(vec![2u8; 4096]);
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            let data = Bytes::from(vec![0u8; 64 << 10]);
            c.execute(1, &obj(i), vec![OsdOp::WriteFull { data }])
                .await
                .unwrap();
        }
    });

    osd0_comes_back_empty(&mut osds, &mut map, dir.path(), |m| start(0, m));
    // Peered, with the objects to recover counted: the first write of each pair below finds
    // its object lacking (the rate lets a few go back meanwhile).
    let lacking = |osds: &[Option<Osd>]| total(osds.iter().flatten(), |m| m.objects_to_recover());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while lacking(&osds) < N as u64 * 3 / 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "osd.0 was never counted as lacking the objects ({} to recover)",
            lacking(&osds)
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    let overtaken = carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        let mut overtaken = Vec::new();
        for i in 0..N {
            let oid = obj(i);
            // 0 to 3.5 ms between the two: around the time a recovery of one object takes.
            let gap = Duration::from_micros(250 * (i % 15) as u64);
            let one = c.execute(
                1,
                &oid,
                vec![OsdOp::WriteFull {
                    data: first.clone(),
                }],
            );
            let two = async {
                carmine_reactor::sleep(gap).await;
                c.execute(
                    1,
                    &oid,
                    vec![OsdOp::WriteFull {
                        data: second.clone(),
                    }],
                )
                .await
            };
            let (a, b) = futures::join!(one, two);
            a.unwrap();
            b.unwrap();
            let got = c
                .execute(1, &oid, vec![OsdOp::Read { off: 0, len: 0 }])
                .await
                .unwrap();
            match &got[..] {
                [OpOutput::Data(d)] if d == &second => {}
                [OpOutput::Data(d)] if d == &first => overtaken.push((oid, gap)),
                other => panic!("{oid}: {other:?}"),
            }
        }
        overtaken
    });
    eprintln!(
        "{} objects still to recover after the writes",
        lacking(&osds)
    );
    assert!(
        overtaken.is_empty(),
        "{} of {N} objects kept the write sent first: {overtaken:?}",
        overtaken.len()
    );
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// A read of an object never returns a write to it that is still in flight: that write may be
/// in the primary's store alone, and vanish with it. Here a replica is gone unnoticed (the map
/// still has it up), so a write stays in flight; a read of its object sent meanwhile waits
/// (and is refused once the wait is over), and never returns the write's data. (A read used to
/// return it at once, from the primary's store.)
#[test]
fn a_read_never_returns_a_write_still_in_flight() {
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("ordering-read");
    let mut map = three_osd_map(1);
    let mut osds = start_tuned(&map, dir.path(), |c| OsdConfig {
        write_ack_wait: Duration::from_secs(2),
        // Long enough that the read below meets the write, not a lapsed lease, however slow
        // the box.
        read_lease: Duration::from_secs(6),
        ..c
    });
    wait_settled(&map, dir.path());
    let oid = object_not_led_by(&map, 2, "r");
    let old = Bytes::from(vec![1u8; 4096]);
    let new = Bytes::from(vec![2u8; 4096]);
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        c.execute(1, &oid, vec![OsdOp::WriteFull { data: old.clone() }])
            .await
            .unwrap();
        assert_eq!(c.read(1, &oid, 0, 0).await.unwrap(), old);
    });
    osds[2].take().unwrap().shutdown().unwrap();
    carmine_reactor::block_on(async {
        let writer = client(&map, Duration::from_secs(1)).await;
        let reader = client(&map, Duration::from_secs(1)).await;
        let put = writer.execute(1, &oid, vec![OsdOp::WriteFull { data: new.clone() }]);
        let get = async {
            carmine_reactor::sleep(Duration::from_millis(200)).await;
            reader.read(1, &oid, 0, 0).await
        };
        let (put, got) = futures::join!(put, get);
        // Never acknowledged (the client gives up first, or hears "in doubt").
        put.expect_err("acknowledged without a replica");
        match got {
            Ok(data) => assert!(data != new, "a read returned a write still in flight"),
            Err(e) => eprintln!("the read was refused: {e}"),
        }
    });
    let held = total(osds.iter().flatten(), |m| m.reads_held_by_writes());
    assert!(held >= 1, "no read counted as held behind a write");
    // The map notices; the PG goes on without osd.2, and the write, which the primary holds,
    // is the PG's (a read returns it once it is on every acting member).
    next(&mut map, |m| m.osds[2].up = false);
    publish(&mut osds, &map, dir.path());
    carmine_reactor::block_on(async {
        // (The new interval waits out the old one's leases first.)
        let c = client(&map, Duration::from_secs(30)).await;
        let got = c.read(1, &oid, 0, 0).await.unwrap();
        assert!(
            got == new || got == old,
            "neither write: {} bytes",
            got.len()
        );
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}
