//! Liveness (issue #11): OSDs registered under etcd leases (or, with the map in a file, under
//! locks beside it), managers that mark them down and up in new epochs, OSDs and clients that
//! follow the epochs, and an etcd outage that stalls the data path (the OSDs fence themselves
//! once their leases may have run out) without failing a request. Real processes, a real
//! (private) etcd.

mod common;

use carmine_cluster::OsdMap;
use carmine_proto::{Request, Response};
use common::{alive, kill9, Cluster};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const TTL: u64 = 2;

fn pid_of(c: &Cluster, file: &str) -> i32 {
    std::fs::read_to_string(c.dir.join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

fn map(c: &Cluster) -> OsdMap {
    carmine_localcluster::read_map(&c.dir).expect("reading the map")
}

fn key(c: &Cluster) -> Option<carmine_proto::auth::AuthKey> {
    carmine_localcluster::read_key(&c.dir).expect("the cluster key")
}

fn client_cfg(c: &Cluster) -> carmine_client::ClientConfig {
    carmine_client::ClientConfig {
        key: key(c),
        ..Default::default()
    }
}

/// The epoch OSD reactor `addr` serves by, asked over the wire.
fn served_epoch(addr: SocketAddr, key: Option<&carmine_proto::auth::AuthKey>) -> Option<u32> {
    carmine_reactor::block_on(async move {
        let conn = carmine_client::Connection::open_with(addr, 1, key)
            .await
            .ok()?;
        let r = conn.call(&Request::GetMap).await.ok();
        conn.close();
        match r? {
            Response::Map { encoded } => OsdMap::decode(encoded).ok().map(|m| m.epoch),
            _ => None,
        }
    })
}

/// Waits up to `limit` for `done` to hold of the map; returns it and how long it took.
fn wait_map(c: &Cluster, limit: Duration, done: impl Fn(&OsdMap) -> bool) -> (OsdMap, Duration) {
    let start = Instant::now();
    loop {
        let m = map(c);
        if done(&m) {
            return (m, start.elapsed());
        }
        assert!(
            start.elapsed() < limit,
            "the map did not change as expected within {limit:?}; epoch {} osds {:?}",
            m.epoch,
            m.osds
                .iter()
                .map(|o| (o.id, o.up, o.in_))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every live OSD of `m` serves epoch `m.epoch` (or newer) within two seconds.
fn osds_follow(c: &Cluster, m: &OsdMap) {
    let key = key(c);
    let deadline = Instant::now() + Duration::from_secs(2);
    for o in m.osds.iter().filter(|o| o.up) {
        for addr in &o.reactors {
            loop {
                let e = served_epoch(*addr, key.as_ref());
                if e.is_some_and(|e| e >= m.epoch) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "osd.{} at {addr} serves epoch {e:?}, the map is at {}",
                    o.id,
                    m.epoch
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn read_volume(c: &Cluster, name: &str, len: usize) -> Vec<u8> {
    let out = c.run(&[
        "volume",
        "read",
        name,
        "--length",
        &len.to_string(),
        "--file",
        "-",
        "-q",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// One copy per PG: these tests are about liveness, where a down OSD's PGs wait for it (with
/// copies, tests/replication.rs).
fn etcd_cluster(name: &str) -> Cluster {
    Cluster::up(
        name,
        &[
            "--with-etcd",
            "--osds",
            "3",
            "--size",
            "1",
            "--lease-ttl",
            &TTL.to_string(),
            "--store",
            "native",
            "--device-size",
            "320M",
        ],
    )
}

#[test]
fn a_killed_osd_is_marked_down_in_a_new_epoch_and_up_again_when_restarted() {
    let c = etcd_cluster("liveness-kill");
    let status = c.ok(&["cluster", "status"]);
    assert!(status.contains("health: HEALTH_OK"), "{status}");
    assert!(status.contains("osd: 3 osds: 3 up, 3 in"), "{status}");
    // Data on every OSD, read back after the restart.
    c.ok(&[
        "volume",
        "create",
        "v",
        "--size",
        "32M",
        "--object-size",
        "1M",
    ]);
    let data: Vec<u8> = (0..8 << 20).map(|i: u32| (i * 13 % 251) as u8).collect();
    c.write_volume("v", &data);
    let before = map(&c);
    // A client that routes by the map, connected before the failure.
    let addrs: Vec<SocketAddr> = before
        .osds
        .iter()
        .flat_map(|o| o.reactors.clone())
        .collect();

    kill9(pid_of(&c, "osd.1.pid"));
    let (down, took) = wait_map(&c, Duration::from_secs(TTL + 2 + 3), |m| {
        m.osd(1).is_some_and(|o| !o.up)
    });
    println!("osd.1 marked down {took:?} after kill -9 (lease TTL {TTL} s)");
    assert_eq!(down.epoch, before.epoch + 1, "one epoch for one change");
    assert!(
        down.osd(1).unwrap().in_,
        "down, but still in: its PGs wait for it"
    );
    assert!(down.osd(0).unwrap().up && down.osd(2).unwrap().up);
    osds_follow(&c, &down);
    carmine_reactor::block_on(async {
        let client = carmine_client::Client::connect(&addrs, client_cfg(&c))
            .await
            .unwrap();
        assert_eq!(
            client.map().epoch,
            down.epoch,
            "a new client gets the new epoch"
        );
    });

    let out = c.run(&["cluster", "status"]);
    assert!(!out.status.success(), "status must not say OK");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("health: HEALTH_WARN"), "{text}");
    assert!(text.contains("1 osds down (osd.1)"), "{text}");
    assert!(text.contains("pgs inactive"), "{text}");
    let tree = c.ok(&["osd", "tree"]);
    assert!(tree.contains("osd.1") && tree.contains("down"), "{tree}");

    // Restarted by `cluster up`: up again in a new epoch, and its data is there.
    let said = c.ok(&["cluster", "up", "--no-pin"]);
    assert!(said.contains("restarting osd.1"), "{said}");
    let up = map(&c);
    assert!(
        up.osd(1).unwrap().up,
        "`up` returns once the map shows it up"
    );
    assert!(up.epoch > down.epoch);
    osds_follow(&c, &up);
    assert!(c.ok(&["cluster", "status"]).contains("HEALTH_OK"));
    assert!(read_volume(&c, "v", data.len()) == data, "data changed");
}

#[test]
fn the_standby_manager_takes_over_when_the_leader_dies() {
    let c = etcd_cluster("liveness-mgr");
    let status = c.ok(&["cluster", "status"]);
    let leader_line = status
        .lines()
        .find(|l| l.trim_start().starts_with("mgr:"))
        .unwrap_or_else(|| panic!("{status}"))
        .to_owned();
    // "mgr: mgr.0#PID-tag leads; 2 of 2 running"
    assert!(
        leader_line.contains("leads; 2 of 2 running"),
        "{leader_line}"
    );
    let leader_pid: i32 = leader_line
        .split('#')
        .nth(1)
        .and_then(|s| s.split('-').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{leader_line}"));
    assert!(alive(leader_pid));
    kill9(leader_pid);

    // With the leader dead, an OSD failure is still noticed: the standby takes over once the
    // leader's lease has run out, then marks the OSD down.
    kill9(pid_of(&c, "osd.2.pid"));
    let (m, took) = wait_map(&c, Duration::from_secs(2 * TTL + 2 + 4), |m| {
        m.osd(2).is_some_and(|o| !o.up)
    });
    println!("osd.2 marked down {took:?} after killing the leader and the OSD");
    let status = String::from_utf8_lossy(&c.run(&["cluster", "status"]).stdout).into_owned();
    assert!(status.contains("leads; 1 of 2 running"), "{status}");
    assert!(!status.contains(&format!("#{leader_pid}-")), "{status}");
    assert!(status.contains("1 of 2 managers running"), "{status}");

    // Every epoch was committed once: the managers' logs never name one twice.
    let mut epochs = Vec::new();
    for i in 0..2 {
        let log = std::fs::read_to_string(c.dir.join(format!("mgr.{i}.log"))).unwrap();
        for l in log.lines() {
            if let Some(rest) = l.split(": epoch ").nth(1) {
                epochs.push(rest.split(':').next().unwrap().parse::<u32>().unwrap());
            }
        }
    }
    epochs.sort_unstable();
    let n = epochs.len();
    epochs.dedup();
    assert_eq!(n, epochs.len(), "an epoch was committed twice: {epochs:?}");
    assert_eq!(epochs.last().copied(), Some(m.epoch));

    // `up` restarts the missing OSD and manager.
    let said = c.ok(&["cluster", "up", "--no-pin"]);
    assert!(said.contains("started mgr."), "{said}");
    assert!(c.ok(&["cluster", "status"]).contains("HEALTH_OK"));
}

#[test]
fn with_etcd_stopped_single_copy_pgs_stall_until_the_leases_are_back_and_replicated_ones_go_on() {
    let c = etcd_cluster("liveness-outage");
    // A pool of three copies beside the single-copy one: its primaries are fenced by the read
    // leases their copies grant, which an outage of etcd leaves alone.
    c.ok(&["pool", "create", "three", "--size", "3", "--pg-num", "8"]);
    c.ok(&[
        "volume",
        "create",
        "v",
        "--size",
        "16M",
        "--object-size",
        "1M",
    ]);
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i * 29 % 253) as u8).collect();
    c.write_volume("v", &data);
    let before = map(&c);
    let addrs: Vec<SocketAddr> = before
        .osds
        .iter()
        .flat_map(|o| o.reactors.clone())
        .collect();
    // The replicated PGs peer (recording their intervals in etcd) before etcd stops.
    carmine_reactor::block_on(async {
        let client = carmine_client::Client::connect(&addrs, client_cfg(&c))
            .await
            .unwrap();
        let three = client.pool_id("three").unwrap();
        for i in 0..16 {
            let body = bytes::Bytes::from(vec![0xee; 4096]);
            client
                .write(three, &format!("three-{i}"), 0, body)
                .await
                .unwrap();
        }
    });
    let etcd = pid_of(&c, "etcd.pid");
    // SAFETY: plain syscall on the private etcd this test's cluster started.
    unsafe { libc::kill(etcd, libc::SIGSTOP) };
    let frozen = Instant::now();
    // etcd comes back after a while; meanwhile the OSDs cannot renew their leases.
    const PAUSE: Duration = Duration::from_secs(5);
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(PAUSE);
        // SAFETY: as above.
        unsafe { libc::kill(etcd, libc::SIGCONT) };
    });
    // Reads and writes to the OSDs go on while the OSDs' leases surely hold (80% of the TTL
    // after their last renewal); then the OSDs serve nothing, since the managers might have
    // marked them down and moved their PGs (an OSD cannot tell an etcd outage from being cut
    // off itself), and the requests wait; once etcd is back they resume. None fails. (The CLI
    // reads the map from etcd, so this client bootstraps from the OSDs' addresses directly.)
    let ((rounds, early, stall), (replicated_rounds, replicated_stall)) =
        carmine_reactor::block_on(async {
            let client = carmine_client::Client::connect(&addrs, client_cfg(&c))
                .await
                .expect("connecting with etcd stopped");
            let pool = client.pool_id("rbd").unwrap();
            let three = client.pool_id("three").unwrap();
            // One round: 16 objects written and read back; the longest of those waits.
            let round = |pool: u32, prefix: &'static str, n: u32| {
                let client = &client;
                async move {
                    let mut stall = Duration::ZERO;
                    for i in 0..16 {
                        let oid = format!("{prefix}-{i}");
                        let body = bytes::Bytes::from(vec![n as u8; 4096]);
                        let t = Instant::now();
                        client.write(pool, &oid, 0, body.clone()).await.unwrap();
                        assert_eq!(client.read(pool, &oid, 0, 4096).await.unwrap(), body);
                        stall = stall.max(t.elapsed());
                    }
                    stall
                }
            };
            // The replicated pool, through the outage itself (after it, the leases etcd let run out
            // meanwhile may churn the map).
            let replicated = async {
                let (mut rounds, mut stall) = (0u32, Duration::ZERO);
                while frozen.elapsed() < PAUSE - Duration::from_millis(500) {
                    stall = stall.max(round(three, "three", rounds).await);
                    rounds += 1;
                }
                (rounds, stall)
            };
            let single = async {
                let (mut rounds, mut early, mut stall) = (0, 0, Duration::ZERO);
                while frozen.elapsed() < PAUSE + Duration::from_secs(2 * TTL + 4) {
                    stall = stall.max(round(pool, "outage", rounds).await);
                    rounds += 1;
                    if frozen.elapsed() < Duration::from_secs(TTL) / 2 {
                        early = rounds;
                    }
                }
                (rounds, early, stall)
            };
            futures::join!(single, replicated)
        });
    thaw.join().unwrap();
    println!(
        "replicated pool with etcd stopped: {replicated_rounds} rounds of 16 writes and reads, \
         the longest wait {replicated_stall:?}"
    );
    assert!(
        replicated_rounds > 0 && replicated_stall < Duration::from_secs(TTL) / 2,
        "the replicated pool stalled with etcd stopped: {replicated_rounds} rounds, the longest \
         wait {replicated_stall:?} (its primaries hold read leases from their copies, which do \
         not need etcd)"
    );
    assert!(early > 0, "no I/O while the leases held");
    assert!(
        stall >= PAUSE - Duration::from_secs(TTL),
        "I/O went on with etcd stopped for {PAUSE:?} (longest wait {stall:?}): an OSD whose \
         lease may have run out served"
    );
    let said = (0..3)
        .map(|i| std::fs::read_to_string(c.dir.join(format!("osd.{i}.log"))).unwrap_or_default())
        .collect::<String>();
    assert!(said.contains("serving no client"), "{said}");
    assert!(said.contains("serving clients again"), "{said}");
    // Every daemon is still there.
    for f in [
        "osd.0.pid",
        "osd.1.pid",
        "osd.2.pid",
        "mgr.0.pid",
        "mgr.1.pid",
    ] {
        assert!(alive(pid_of(&c, f)), "{f} died while etcd was stopped");
    }
    println!(
        "etcd stopped {PAUSE:?}: {early} rounds of 16 writes and reads in its first {:?}, \
         {rounds} in all; the longest wait {stall:?}",
        Duration::from_secs(TTL) / 2
    );
    // Back: map changes work again (whatever lease churn the pause caused settles), and the
    // cluster is healthy with every OSD up.
    let (settled, took) = wait_map(&c, Duration::from_secs(4 * TTL + 10), |m| {
        m.osds.iter().all(|o| o.up) && m.epoch >= before.epoch
    });
    println!(
        "settled at epoch {} {took:?} after etcd came back",
        settled.epoch
    );
    // A single-copy pool: marking out would strand osd.2's data, so it is refused...
    let err = c.fails(&["osd", "out", "2"]);
    assert!(err.contains("keep a single copy"), "{err}");
    assert!(map(&c).osd(2).unwrap().in_);
    // ...unless asked for; the map change goes through etcd like the managers' own.
    let said = c.ok(&["osd", "out", "2", "--allow-single-copy-moves"]);
    assert!(said.contains("marked osd.2 out"), "{said}");
    let (out, _) = wait_map(&c, Duration::from_secs(5), |m| !m.osd(2).unwrap().in_);
    assert!(!out.osd(2).unwrap().auto_out);
    osds_follow(&c, &out);
    c.ok(&["osd", "in", "2", "--allow-single-copy-moves"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = c.run(&["cluster", "status"]);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(read_volume(&c, "v", data.len()) == data, "data changed");
}

/// The same roles without etcd, for a cluster whose map is a file: an OSD is alive while its
/// process holds the lock on its registration, so a kill -9 is seen at once (no lease to run
/// out); one manager leads by holding a lock, and the standby takes over when it dies; a
/// second process with a running OSD's id is refused.
#[test]
fn a_file_map_cluster_notices_deaths_at_once_and_its_standby_manager_takes_over() {
    let c = Cluster::up("liveness-local", &["--osds", "3"]);
    let status = c.ok(&["cluster", "status"]);
    assert!(status.contains("health: HEALTH_OK"), "{status}");
    assert!(status.contains("leads; 2 of 2 running"), "{status}");
    let before = map(&c);

    kill9(pid_of(&c, "osd.1.pid"));
    let (down, took) = wait_map(&c, Duration::from_secs(3), |m| {
        m.osd(1).is_some_and(|o| !o.up)
    });
    println!("file map: osd.1 marked down {took:?} after kill -9");
    assert_eq!(down.epoch, before.epoch + 1, "one epoch for one change");
    assert!(
        down.osd(1).unwrap().in_,
        "down, but still in: its PGs wait for it"
    );
    osds_follow(&c, &down);
    let out = c.run(&["cluster", "status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 osds down (osd.1)"), "{text}");

    // The leader dies: the standby leads and notices the next death.
    let leader_pid: i32 = text
        .split("mgr: mgr.")
        .nth(1)
        .and_then(|s| s.split('#').nth(1))
        .and_then(|s| s.split('-').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    kill9(leader_pid);
    kill9(pid_of(&c, "osd.2.pid"));
    let (m, took) = wait_map(&c, Duration::from_secs(3), |m| {
        m.osd(2).is_some_and(|o| !o.up)
    });
    println!("file map: osd.2 marked down {took:?} after killing it and the leading manager");
    assert_eq!(m.epoch, down.epoch + 1);
    let text = String::from_utf8_lossy(&c.run(&["cluster", "status"]).stdout).into_owned();
    assert!(text.contains("leads; 1 of 2 running"), "{text}");
    assert!(!text.contains(&format!("#{leader_pid}-")), "{text}");

    // A second osd.0 is refused while the first runs, and changes nothing.
    let out = c.run(&[
        "osd",
        "--id",
        "0",
        "--map",
        &c.dir.join("osdmap").display().to_string(),
        "--no-pin",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("osd.0 is already running: pid"), "{err}");
    assert!(map(&c).osd(0).unwrap().up);

    // `up` restarts what is missing; the map shows them up again.
    let said = c.ok(&["cluster", "up", "--no-pin"]);
    assert!(said.contains("restarting osd.1, osd.2"), "{said}");
    assert!(said.contains("started mgr."), "{said}");
    let up = map(&c);
    assert!(up.osds.iter().all(|o| o.up), "{:?}", up.osds);
    assert!(c.ok(&["cluster", "status"]).contains("HEALTH_OK"));
}

/// The epochs an OSD's log says it applied, in the order it applied them.
fn epochs_applied(c: &Cluster, id: u32) -> Vec<u32> {
    let log = std::fs::read_to_string(c.dir.join(format!("osd.{id}.log"))).unwrap();
    let prefix = format!("osd.{id}: map epoch ");
    log.lines()
        .filter_map(|l| l.strip_prefix(&prefix)?.split(' ').next()?.parse().ok())
        .collect()
}

#[test]
fn an_osd_that_falls_behind_the_map_applies_every_epoch_it_missed_in_turn() {
    // With the map in etcd an OSD replays the map key's history from the last epoch it saw:
    // a reactor that skips an epoch cannot tell whether a PG's acting set changed in between,
    // and peers every PG again (decision 0015, step 4).
    // A lease of 6 s: osd.0 must not be marked down while it sleeps (which would add
    // epochs of its own, and leave it out of the OSDs followed below).
    let c = Cluster::up(
        "liveness-replay",
        &[
            "--with-etcd",
            "--osds",
            "3",
            "--size",
            "1",
            "--lease-ttl",
            "6",
        ],
    );
    let before = map(&c);
    osds_follow(&c, &before);
    let pid = pid_of(&c, "osd.0.pid");
    common::stop(pid);
    let resume = common::Continue(pid);
    // Four epochs while osd.0 sleeps (well within its lease: no other change comes). The
    // PGs hold no data, so moving single copies hides nothing.
    for weight in ["0.9", "0.8", "0.7", "0.6"] {
        c.ok(&["osd", "reweight", "2", weight, "--allow-single-copy-moves"]);
    }
    let missed = map(&c);
    assert!(
        missed.epoch >= before.epoch + 4,
        "{} → {}",
        before.epoch,
        missed.epoch
    );
    drop(resume);
    let start = Instant::now();
    let applied: Vec<u32> = loop {
        let applied: Vec<u32> = epochs_applied(&c, 0)
            .into_iter()
            .filter(|e| *e > before.epoch)
            .collect();
        if applied.last() >= Some(&missed.epoch) || start.elapsed() > Duration::from_secs(10) {
            break applied;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let expected: Vec<u32> = (before.epoch + 1..=applied.last().copied().unwrap_or(0)).collect();
    assert_eq!(applied, expected, "every epoch once, in order");
    assert!(applied.last() >= Some(&missed.epoch), "{applied:?}");
    c.ok(&["cluster", "down"]);
}

#[test]
fn a_primary_restarted_at_once_with_an_empty_memory_store_peers_in_its_epoch_and_loses_nothing() {
    // A memory store comes back empty. Restarted at once, the new process takes over the
    // registration of its predecessor, whose process is gone, without waiting out its lease:
    // the map never moves, and the OSD peers again as the primary of its PGs in the epoch it
    // was in, with nothing. It takes their history from its members, fetches its objects
    // back, and its new writes get versions of a new run (decision 0009, "Runs its members
    // took").
    let c = Cluster::up(
        "liveness-quick-restart",
        &[
            "--with-etcd",
            "--osds",
            "3",
            "--pg-num",
            "16",
            // Ample for `cluster up` to restart it before the old lease would run out.
            "--lease-ttl",
            "8",
        ],
    );
    c.ok(&[
        "volume",
        "create",
        "v",
        "--size",
        "32M",
        "--object-size",
        "1M",
    ]);
    let bytes = |len: u32, seed: u32| -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    };
    // Clean: every copy holds everything (nothing in flight to the victim when it dies, so
    // no peer reports it before it is back).
    let clean = |c: &Cluster| {
        let start = Instant::now();
        loop {
            let out = c.run(&["cluster", "status"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let states = "16 active, 0 peering, 0 inconsistent; 0 objects";
            if out.status.success() && text.contains(states) {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{text}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let mut expected = bytes(16 << 20, 0);
    c.write_volume("v", &expected);
    for round in 1..=3 {
        clean(&c);
        let before = map(&c);
        let mut primaries = std::collections::BTreeMap::<u32, usize>::new();
        for pg in before.all_pgs() {
            if let Some((osd, _)) = before.pg_primary(pg) {
                *primaries.entry(osd).or_default() += 1;
            }
        }
        let victim = primaries.into_iter().max_by_key(|(_, n)| *n).unwrap().0;
        kill9(pid_of(&c, &format!("osd.{victim}.pid")));
        c.ok(&["cluster", "up", "--no-pin"]);
        let data = bytes(8 << 20, round);
        c.write_volume("v", &data);
        expected[..data.len()].copy_from_slice(&data);
        assert!(
            read_volume(&c, "v", expected.len()) == expected,
            "round {round}: data after osd.{victim} came back empty"
        );
        assert_eq!(
            map(&c).epoch,
            before.epoch,
            "round {round}: osd.{victim} came back at once: the map must not have moved"
        );
    }
    clean(&c);
    c.ok(&["cluster", "down"]);
}
