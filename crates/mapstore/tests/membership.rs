//! OSD registrations and manager leadership on a real etcd: leases that run out, keys that
//! only one process can hold, and map changes that only the leader can make.

use carmine_cluster::{OsdInfo, OsdMap, Pool};
use carmine_mapstore::etcd_client::Etcd;
use carmine_mapstore::membership::{leader, registered, Leadership, OsdLease, Registration};
use carmine_mapstore::{EtcdMapStore, MapStore, MapStoreError, PrivateEtcd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct Fixture {
    etcd: Etcd,
    endpoint: String,
    _private: PrivateEtcd,
    dir: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture(name: &str) -> Fixture {
    let dir =
        std::env::temp_dir().join(format!("carmine-membership-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let private = PrivateEtcd::start(&dir)
        .expect("these tests need etcd (Debian: apt-get install etcd-server; .ci/run installs it)");
    let endpoint = private.endpoint().to_owned();
    Fixture {
        etcd: Etcd::new(std::slice::from_ref(&endpoint)).unwrap(),
        endpoint,
        _private: private,
        dir,
    }
}

fn reg(osd: u32, pid: u32) -> Registration {
    Registration {
        osd,
        host: "host-a".into(),
        pid,
        reactors: vec![format!("127.0.0.1:{}", 7000 + osd).parse().unwrap()],
        started: 1,
        capacity: 1 << 30,
        pid_ns: 0,
        boot_id: String::new(),
    }
}

const TTL: Duration = Duration::from_secs(1);

#[test]
fn a_registration_lives_while_renewed_and_vanishes_with_its_lease() {
    let f = fixture("lease");
    let mut a = OsdLease::register(&f.etcd, "c", &reg(0, 10), TTL, Duration::ZERO).unwrap();
    let b = OsdLease::register(&f.etcd, "c", &reg(1, 11), TTL, Duration::ZERO).unwrap();
    let all = registered(&f.etcd, "c").unwrap();
    assert_eq!(all.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(all[&1], reg(1, 11));
    // Another cluster in the same etcd sees none of them.
    assert!(registered(&f.etcd, "other").unwrap().is_empty());
    // osd.0 renews, osd.1 does not (as if killed): after the TTL only osd.0 is left.
    let start = Instant::now();
    while start.elapsed() < TTL * 3 {
        assert!(a.renew().unwrap(), "a renewed lease must not lapse");
        std::thread::sleep(TTL / 4);
    }
    let left: Vec<u32> = registered(&f.etcd, "c").unwrap().into_keys().collect();
    assert_eq!(left, vec![0], "osd.1's key must go with its lease");
    drop(b);
    a.release().unwrap();
    assert!(registered(&f.etcd, "c").unwrap().is_empty());
}

#[test]
fn a_second_process_cannot_register_the_same_osd() {
    let f = fixture("twice");
    let _first = OsdLease::register(&f.etcd, "c", &reg(3, 10), TTL * 5, Duration::ZERO).unwrap();
    let err = OsdLease::register(
        &f.etcd,
        "c",
        &reg(3, 99),
        TTL * 5,
        Duration::from_millis(300),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("osd.3 is already running: pid 10"), "{err}");
    assert_eq!(registered(&f.etcd, "c").unwrap()[&3].pid, 10);
}

#[test]
fn a_restarted_osd_takes_its_key_once_the_crashed_ones_lease_runs_out() {
    let f = fixture("restart");
    // The first incarnation "crashes": its lease is neither renewed nor revoked.
    std::mem::forget(OsdLease::register(&f.etcd, "c", &reg(2, 10), TTL, Duration::ZERO).unwrap());
    let start = Instant::now();
    let second = OsdLease::register(&f.etcd, "c", &reg(2, 20), TTL, TTL * 4).unwrap();
    assert!(
        start.elapsed() >= TTL / 2,
        "it had to wait for the old lease"
    );
    assert_eq!(registered(&f.etcd, "c").unwrap()[&2].pid, 20);
    second.release().unwrap();
}

/// A registration of osd.2 on this host, in this PID namespace, by process `pid`.
fn here(pid: u32) -> Registration {
    Registration {
        host: carmine_mapstore::membership::host_name(),
        pid_ns: carmine_mapstore::membership::pid_namespace(),
        boot_id: carmine_mapstore::membership::boot_id(),
        ..reg(2, pid)
    }
}

#[test]
fn a_restarted_osd_takes_over_the_key_of_its_predecessor_whose_process_is_gone() {
    let f = fixture("succeed");
    assert_ne!(carmine_mapstore::membership::pid_namespace(), 0);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    // The predecessor "crashes" with its lease running for long.
    std::mem::forget(
        OsdLease::register(&f.etcd, "c", &here(dead), TTL * 30, Duration::ZERO).unwrap(),
    );
    let start = Instant::now();
    let me = std::process::id();
    let second = OsdLease::register(&f.etcd, "c", &here(me), TTL, Duration::ZERO).unwrap();
    assert!(start.elapsed() < TTL, "it must not wait out the old lease");
    assert_eq!(registered(&f.etcd, "c").unwrap()[&2].pid, me);
    // The key is under the new lease: released, it goes at once.
    second.release().unwrap();
    assert!(registered(&f.etcd, "c").unwrap().is_empty());
}

#[test]
fn a_holder_whose_key_was_taken_over_learns_it_at_its_next_renewal() {
    let f = fixture("displaced");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    // A holder judged gone wrongly (as a pid check on the wrong machine would): its lease
    // keeps running, but its key is taken over.
    let mut old = OsdLease::register(&f.etcd, "c", &here(dead), TTL * 30, Duration::ZERO).unwrap();
    let me = std::process::id();
    let _new = OsdLease::register(&f.etcd, "c", &here(me), TTL * 30, Duration::ZERO).unwrap();
    match old.renew() {
        Err(MapStoreError::Displaced(why)) => {
            assert!(why.contains(&format!("pid {me}")), "{why}")
        }
        other => panic!("a displaced holder must be told, got {other:?}"),
    }
    // The successor's key is left as it is.
    assert_eq!(registered(&f.etcd, "c").unwrap()[&2].pid, me);
}

#[test]
fn a_key_deleted_by_hand_is_put_back_at_the_next_renewal() {
    let f = fixture("deleted");
    let mut l = OsdLease::register(&f.etcd, "c", &reg(5, 10), TTL * 30, Duration::ZERO).unwrap();
    assert!(l.renew().unwrap());
    let key = carmine_mapstore::keys::alive("c", 5);
    assert!(f
        .etcd
        .txn(&[], &[carmine_mapstore::etcd_client::Put::Delete(&key)])
        .unwrap());
    assert!(registered(&f.etcd, "c").unwrap().is_empty());
    assert!(
        !l.renew().unwrap(),
        "renewal reports that it had to register again"
    );
    assert_eq!(registered(&f.etcd, "c").unwrap()[&5].pid, 10);
    // Under its own lease: released, it goes at once.
    l.release().unwrap();
    assert!(registered(&f.etcd, "c").unwrap().is_empty());
}

#[test]
fn a_live_predecessor_or_one_of_another_pid_namespace_or_boot_keeps_its_key() {
    let f = fixture("keep");
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let live = sleeper.id();
    let _held = OsdLease::register(&f.etcd, "c", &here(live), TTL * 30, Duration::ZERO).unwrap();
    let me = std::process::id();
    let wait = Duration::from_millis(300);
    let err = OsdLease::register(&f.etcd, "c", &here(me), TTL, wait).unwrap_err();
    assert!(err.to_string().contains("already running"), "{err}");
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    // Gone now, but the holder said another PID namespace or boot (or none): its pid means
    // nothing here, so the key waits for its lease.
    let ns = carmine_mapstore::membership::pid_namespace();
    let others = [
        Registration {
            pid_ns: 0,
            ..here(live)
        },
        Registration {
            pid_ns: ns + 1,
            ..here(live)
        },
        Registration {
            boot_id: String::new(),
            ..here(live)
        },
        Registration {
            boot_id: "another machine".into(),
            ..here(live)
        },
    ];
    for (i, other) in others.iter().enumerate() {
        let f = fixture(&format!("other{i}"));
        let _held = OsdLease::register(&f.etcd, "c", other, TTL * 30, Duration::ZERO).unwrap();
        let err = OsdLease::register(&f.etcd, "c", &here(me), TTL, wait).unwrap_err();
        assert!(err.to_string().contains("already running"), "{err}");
    }
}

#[test]
fn a_lapsed_lease_is_taken_again_on_renewal() {
    let f = fixture("lapse");
    let mut l = OsdLease::register(&f.etcd, "c", &reg(4, 10), TTL, Duration::ZERO).unwrap();
    std::thread::sleep(TTL * 3);
    assert!(registered(&f.etcd, "c").unwrap().is_empty());
    assert!(
        !l.renew().unwrap(),
        "renewal reports that the lease had lapsed"
    );
    assert_eq!(registered(&f.etcd, "c").unwrap()[&4].pid, 10);
    assert!(l.renew().unwrap());
}

fn map(epoch: u32) -> OsdMap {
    OsdMap {
        epoch,
        osds: vec![OsdInfo::new(
            0,
            "h",
            vec!["127.0.0.1:7000".parse().unwrap()],
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
    }
}

#[test]
fn one_leader_at_a_time_and_only_the_leader_changes_the_map() {
    let f = fixture("leader");
    let store = EtcdMapStore::new(std::slice::from_ref(&f.endpoint), "c").unwrap();
    store.swap(None, &map(1)).unwrap();
    let a = Leadership::campaign(&f.etcd, "c", "mgr.a#1", TTL)
        .unwrap()
        .unwrap();
    assert!(Leadership::campaign(&f.etcd, "c", "mgr.b#2", TTL)
        .unwrap()
        .is_none());
    assert_eq!(leader(&f.etcd, "c").unwrap().as_deref(), Some("mgr.a#1"));
    store
        .swap_guarded(Some(&map(1)), &map(2), &[a.guard()])
        .unwrap();
    // a stops renewing (a paused process): its lease runs out and b takes over.
    let deadline = Instant::now() + TTL * 5;
    let b = loop {
        if let Some(b) = Leadership::campaign(&f.etcd, "c", "mgr.b#2", TTL).unwrap() {
            break b;
        }
        assert!(Instant::now() < deadline, "b never became leader");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!a.renew().unwrap(), "a must learn it lost the lease");
    // a, deposed but unaware, tries to commit: refused, and the map is as it was.
    match store.swap_guarded(Some(&map(2)), &map(3), &[a.guard()]) {
        Err(MapStoreError::Deposed) => {}
        other => panic!("a deposed leader's change must be refused, got {other:?}"),
    }
    assert_eq!(store.get().unwrap().unwrap().epoch, 2);
    store
        .swap_guarded(Some(&map(2)), &map(3), &[b.guard()])
        .unwrap();
    b.resign().unwrap();
    assert_eq!(leader(&f.etcd, "c").unwrap(), None);
}

/// A map as format 1 encoded it (clusters made before format 2 keep one in their store).
fn format1_map_bytes() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(b"CMAP");
    v.extend_from_slice(&1u16.to_le_bytes());
    v.extend_from_slice(&3u32.to_le_bytes()); // epoch
    v.extend_from_slice(&1u32.to_le_bytes()); // one OSD
    v.extend_from_slice(&0u32.to_le_bytes());
    v.push(1); // up
    v.extend_from_slice(&1u32.to_le_bytes());
    let addr = b"127.0.0.1:7000";
    v.extend_from_slice(&(addr.len() as u32).to_le_bytes());
    v.extend_from_slice(addr);
    v.extend_from_slice(&1u32.to_le_bytes()); // one pool
    v.extend_from_slice(&1u32.to_le_bytes());
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(b"rbd");
    v.extend_from_slice(&8u32.to_le_bytes());
    v.push(1);
    let crc = carmine_types::crc32c(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

#[test]
fn a_map_stored_in_format_1_can_be_changed_on_both_backends() {
    use carmine_mapstore::etcd_client::Put;
    use carmine_mapstore::LocalMapStore;
    let raw = format1_map_bytes();
    let old = OsdMap::decode(raw.clone().into()).unwrap();
    let mut next = old.clone();
    next.epoch += 1;
    next.osds[0].up = false;
    // etcd: the stored bytes are not what the decoded map re-encodes to.
    let f = fixture("format1");
    let store = EtcdMapStore::new(std::slice::from_ref(&f.endpoint), "c").unwrap();
    assert!(f
        .etcd
        .txn(
            &[],
            &[Put::Put {
                key: store.key(),
                value: &raw,
                lease: 0
            }]
        )
        .unwrap());
    store.swap(Some(&old), &next).unwrap();
    assert_eq!(store.get().unwrap().unwrap(), next);
    // A stale expectation is still a conflict, not a write.
    assert!(matches!(
        store.swap(Some(&old), &next),
        Err(MapStoreError::Invalid(_)) | Err(MapStoreError::Conflict { .. })
    ));
    // The local file, likewise.
    let path = f.dir.join("osdmap");
    std::fs::write(&path, &raw).unwrap();
    let local = LocalMapStore::new(path);
    local.swap(Some(&old), &next).unwrap();
    assert_eq!(local.get().unwrap().unwrap(), next);
}
