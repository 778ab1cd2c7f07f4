//! Reads and writes of one object take turns at its primary (issue #12): a read waits for the
//! writes in flight to its object, and a write that comes while such a read waits waits for
//! that read. Real processes; a replica stopped with SIGSTOP holds a write in flight.

mod common;

use bytes::Bytes;
use carmine_proto::OsdOp;
use common::{metric, stop, Cluster, Continue};
use std::net::SocketAddr;
use std::time::Duration;

#[test]
fn a_write_that_comes_while_a_read_waits_for_its_object_goes_after_that_read() {
    let c = Cluster::up("turns", &["--osds", "3", "--pg-num", "8"]);
    let map = carmine_localcluster::read_map(&c.dir).unwrap();
    let pool = map.pools[0].clone();
    assert_eq!(pool.size, 3);
    let oid = "turns";
    let acting = map.pg_osds(map.object_pg(&pool, oid), pool.size);
    assert_eq!(acting.len(), 3);
    let replica = c.osd_pid(acting[1]);
    let addrs: Vec<SocketAddr> = map.osds.iter().flat_map(|o| o.reactors.clone()).collect();
    let cfg = carmine_client::ClientConfig {
        key: carmine_localcluster::read_key(&c.dir).unwrap(),
        ..Default::default()
    };
    let block = |b: u8| Bytes::from(vec![b; 4096]);
    carmine_reactor::block_on(async {
        let client = carmine_client::Client::connect(&addrs, cfg.clone())
            .await
            .unwrap();
        let write = |b: u8| {
            let client = &client;
            async move {
                client
                    .execute(pool.id, oid, vec![OsdOp::WriteFull { data: block(b) }])
                    .await
            }
        };
        write(1).await.unwrap();
        assert_eq!(client.read(pool.id, oid, 0, 0).await.unwrap(), block(1));

        // A replica stops: the next write stays in flight (on the primary and the other
        // replica, not acknowledged) until it continues.
        let resumed = Continue(replica);
        stop(replica);
        let first = write(2);
        let read = async {
            carmine_reactor::sleep(Duration::from_millis(150)).await;
            client.read(pool.id, oid, 0, 0).await
        };
        let second = async {
            carmine_reactor::sleep(Duration::from_millis(300)).await;
            write(3).await
        };
        let resume = async {
            // Well within a read lease (2 s): the read meets the write, not a lapsed lease.
            carmine_reactor::sleep(Duration::from_millis(700)).await;
            drop(resumed);
        };
        let (first, read, second, ()) = futures::join!(first, read, second, resume);
        first.expect("the first write, once the replica continued");
        second.expect("the second write, once the read was answered");
        // The read came after the first write and before the second: it returned the first
        // (not a write still in flight, and not one that came after it and overtook it).
        let got = read.expect("the read, once the first write was acknowledged");
        assert!(
            got == block(2),
            "the read returned block {:?}, not the first write's",
            got.first()
        );
        assert_eq!(client.read(pool.id, oid, 0, 0).await.unwrap(), block(3));
    });
    // It was held, not just late: the primary counted it.
    let primary = acting[0];
    assert!(metric(&c, primary, "carmine_osd_reads_held_by_writes_total") >= 1);
    assert!(metric(&c, primary, "carmine_osd_writes_held_by_reads_total") >= 1);
}
