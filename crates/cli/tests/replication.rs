//! Replication with real processes (issue #12): three OSDs keep three copies; an OSD killed
//! with SIGKILL costs the clients a short stall and no data; one that comes back empty is
//! filled again, so that losing each of the others in turn still loses nothing.

mod common;

use carmine_mapstore::{LocalPgHistory, PgHistoryStore};
use common::{alive, Cluster};
use std::time::{Duration, Instant};

fn kill9(pid: i32) {
    // SAFETY: plain syscall on a pid this test's cluster started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

fn osd_pid(c: &Cluster, id: u32) -> i32 {
    std::fs::read_to_string(c.dir.join(format!("osd.{id}.pid")))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Deterministic, incompressible-looking bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn read_volume(c: &Cluster, len: usize) -> Vec<u8> {
    let out = c
        .cmd(&[
            "volume",
            "read",
            "v",
            "--file",
            "-",
            "-q",
            "--length",
            &len.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "volume read: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Waits until every PG went active with all three OSDs and settled its history on that.
fn wait_clean(c: &Cluster) -> Duration {
    let start = Instant::now();
    let map = carmine_localcluster::read_map(&c.dir).unwrap();
    let histories = LocalPgHistory::new(&c.dir);
    for pg in map.all_pgs() {
        loop {
            let h = histories.get(pg).unwrap();
            if matches!(&h.intervals[..], [i] if i.acting.len() == 3) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "pg {pg} is not clean: {h:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    start.elapsed()
}

#[test]
fn three_copies_survive_kill_9_and_osds_that_come_back_empty_are_refilled() {
    // Three OSDs make a pool of three copies, two of them needed.
    let c = Cluster::up("replication", &["--osds", "3", "--pg-num", "16"]);
    let status = c.ok(&["cluster", "status"]);
    assert!(status.contains("size 3"), "{status}");
    c.ok(&["volume", "create", "v", "--size", "32M"]);
    const MIB: usize = 1 << 20;
    let first = pattern(16 * MIB, 1);
    c.write_volume("v", &first);
    wait_clean(&c);

    // osd.0 dies mid-life: the next write waits for the map to mark it down and the PGs to
    // peer without it, then goes on with two copies.
    let victim = osd_pid(&c, 0);
    kill9(victim);
    let second = pattern(8 * MIB, 2);
    let t = Instant::now();
    c.write_volume("v", &second);
    let stall = t.elapsed();
    eprintln!("8 MiB written through the loss of osd.0 in {stall:?}");
    let mut expected = first.clone();
    expected[..second.len()].copy_from_slice(&second);
    assert!(
        read_volume(&c, 16 * MIB) == expected,
        "data after losing osd.0"
    );
    assert!(!alive(victim));

    // It comes back with an empty memory store; peering copies every object to it.
    c.ok(&["cluster", "up"]);
    eprintln!("osd.0 refilled in {:?}", wait_clean(&c));
    let status = c.ok(&["cluster", "status"]);
    assert!(status.contains("HEALTH_OK"), "{status}");

    // The other two go in turn, each coming back empty: what is left always holds it all.
    for id in [1, 2] {
        kill9(osd_pid(&c, id));
        assert!(
            read_volume(&c, 16 * MIB) == expected,
            "data after losing osd.{id}"
        );
        let third = pattern(MIB, 10 + id as u64);
        c.write_volume("v", &third);
        expected[..MIB].copy_from_slice(&third);
        c.ok(&["cluster", "up"]);
        eprintln!("osd.{id} refilled in {:?}", wait_clean(&c));
    }
    // Only osd.0 and osd.1 hold what they held before osd.2 went, both refilled once.
    kill9(osd_pid(&c, 2));
    assert!(read_volume(&c, 16 * MIB) == expected, "data at the end");
}
