//! The same map-store contract, checked on both backends: the local file and a real etcd
//! (a private one from PATH; `.ci/run` installs Debian's etcd-server).

use carmine_cluster::OsdMap;
use carmine_mapstore::etcd_client::{Etcd, Put};
use carmine_mapstore::{
    update, EtcdAccess, EtcdMapStore, LocalMapStore, MapStore, MapStoreError, PrivateEtcd,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Store = Box<dyn MapStore + Send>;

mod common;
use common::TestDir;

/// One backend under test: makes handles on the same stored map (one per thread, as separate
/// processes would have), and can damage the stored bytes.
struct Backend {
    make: Arc<dyn Fn() -> Store + Send + Sync>,
    damage: Box<dyn Fn()>,
    _dir: TestDir,
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("carmine-mapstore-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn local(name: &str) -> Backend {
    let dir = TestDir::new("mapstore-local", name);
    let path = dir.dir.join("osdmap");
    let p = path.clone();
    Backend {
        make: Arc::new(move || Box::new(LocalMapStore::new(p.clone())) as Store),
        damage: Box::new(move || {
            let mut raw = std::fs::read(&path).unwrap();
            let mid = raw.len() / 2;
            raw[mid] ^= 0x08;
            std::fs::write(&path, raw).unwrap();
        }),
        _dir: dir,
    }
}

fn etcd(name: &str) -> Backend {
    let dir = TestDir::with_etcd("mapstore-etcd", name);
    let endpoint = dir.endpoint();
    let ep = vec![endpoint.clone()];
    let cluster = name.to_owned();
    let make_ep = ep.clone();
    Backend {
        make: Arc::new(move || Box::new(EtcdMapStore::new(&make_ep, &cluster).unwrap()) as Store),
        damage: {
            let key = EtcdMapStore::new(&ep, name).unwrap().key().to_owned();
            Box::new(move || {
                // Overwrite the value with garbage of the same length, behind the store's back.
                use base64::Engine;
                let b64 = base64::engine::general_purpose::STANDARD;
                let body = serde_json::json!({"key": b64.encode(&key), "value": b64.encode(b"garbage, not a map")});
                ureq::post(&format!("{endpoint}/v3/kv/put"))
                    .send_string(&body.to_string())
                    .unwrap();
            })
        },
        _dir: dir,
    }
}

/// etcd secured as a careful operator runs it: TLS both ways (client certificates required)
/// and etcd auth on. Every call goes through TLS and carries a token.
fn secure_etcd(name: &str) -> Backend {
    let mut dir = TestDir::new("mapstore-tls", name);
    let etcd = PrivateEtcd::start_secure(&dir.dir).expect("a secured private etcd");
    let ep = vec![etcd.endpoint().to_owned()];
    assert!(ep[0].starts_with("https://"), "{ep:?}");
    let access = etcd.access().clone();
    dir.etcd = Some(etcd);
    let cluster = name.to_owned();
    let (make_ep, make_access) = (ep.clone(), access.clone());
    Backend {
        make: Arc::new(move || {
            Box::new(EtcdMapStore::with_access(&make_ep, &make_access, &cluster).unwrap()) as Store
        }),
        damage: {
            let store = EtcdMapStore::with_access(&ep, &access, name).unwrap();
            Box::new(move || {
                let put = Put::Put {
                    key: store.key(),
                    value: b"garbage, not a map",
                    lease: 0,
                };
                assert!(store.etcd().txn(&[], &[put]).unwrap());
            })
        },
        _dir: dir,
    }
}

fn map(epoch: u32, port: u16) -> OsdMap {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut m = OsdMap::single_osd(vec![addr], 16);
    m.epoch = epoch;
    m
}

fn conflict_epoch(r: Result<(), MapStoreError>) -> Option<u32> {
    match r {
        Err(MapStoreError::Conflict { current }) => current.map(|m| m.epoch),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

fn first_swap_creates_and_only_once(b: &Backend) {
    let s = (b.make)();
    assert!(s.get().unwrap().is_none());
    s.swap(None, &map(1, 1000)).unwrap();
    assert_eq!(s.get().unwrap(), Some(map(1, 1000)));
    // A second "first" map loses, and is told what is there.
    assert_eq!(conflict_epoch(s.swap(None, &map(1, 2000))), Some(1));
    assert_eq!((b.make)().get().unwrap(), Some(map(1, 1000)));
}

fn a_stale_swap_conflicts_and_changes_nothing(b: &Backend) {
    let s = (b.make)();
    s.swap(None, &map(1, 1000)).unwrap();
    s.swap(Some(&map(1, 1000)), &map(2, 1001)).unwrap();
    // Someone who read epoch 1 is too late.
    assert_eq!(
        conflict_epoch(s.swap(Some(&map(1, 1000)), &map(2, 9999))),
        Some(2)
    );
    // Same epoch, other content: still not what is stored.
    assert_eq!(
        conflict_epoch(s.swap(Some(&map(2, 1234)), &map(3, 9999))),
        Some(2)
    );
    assert_eq!(s.get().unwrap(), Some(map(2, 1001)));
}

fn epochs_go_up_by_exactly_one_and_maps_must_be_valid(b: &Backend) {
    let s = (b.make)();
    assert!(matches!(
        s.swap(None, &map(2, 1000)),
        Err(MapStoreError::Invalid(_))
    ));
    s.swap(None, &map(1, 1000)).unwrap();
    for bad in [1, 3, 0] {
        assert!(
            matches!(
                s.swap(Some(&map(1, 1000)), &map(bad, 1000)),
                Err(MapStoreError::Invalid(_))
            ),
            "epoch {bad} after 1 was accepted"
        );
    }
    let mut invalid = map(2, 1000);
    invalid.osds[0].reactors.clear();
    assert!(matches!(
        s.swap(Some(&map(1, 1000)), &invalid),
        Err(MapStoreError::Invalid(_))
    ));
    assert_eq!(s.get().unwrap(), Some(map(1, 1000)));
}

fn racing_writers_never_share_an_epoch(b: &Backend) {
    const THREADS: usize = 4;
    const EACH: usize = 8;
    (b.make)().swap(None, &map(1, 1000)).unwrap();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let make = b.make.clone();
            std::thread::spawn(move || {
                let s = make();
                let mut won = Vec::new();
                for _ in 0..EACH {
                    let m = update(&*s, 1000, |cur| {
                        let cur = cur.expect("a map is there");
                        Ok(Some(map(cur.epoch + 1, 10_000 + t as u16)))
                    })
                    .unwrap()
                    .unwrap();
                    won.push(m.epoch);
                }
                won
            })
        })
        .collect();
    let mut all: Vec<u32> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort();
    let want: Vec<u32> = (2..=(1 + THREADS * EACH) as u32).collect();
    assert_eq!(all, want, "every epoch won exactly once");
    assert_eq!(
        (b.make)().get().unwrap().unwrap().epoch,
        1 + (THREADS * EACH) as u32
    );
}

fn a_waiter_sees_the_next_epoch_and_times_out_without_one(b: &Backend) {
    let s = (b.make)();
    s.swap(None, &map(1, 1000)).unwrap();
    let t = Instant::now();
    assert!(s
        .wait_newer(1, Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    // Already newer: at once.
    assert_eq!(
        s.wait_newer(0, Duration::from_secs(5)).unwrap(),
        Some(map(1, 1000))
    );
    let make = b.make.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        make().swap(Some(&map(1, 1000)), &map(2, 2000)).unwrap();
    });
    let t = Instant::now();
    let seen = s.wait_newer(1, Duration::from_secs(10)).unwrap();
    writer.join().unwrap();
    assert_eq!(seen, Some(map(2, 2000)));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

fn a_damaged_map_is_reported_and_never_overwritten(b: &Backend) {
    let s = (b.make)();
    s.swap(None, &map(1, 1000)).unwrap();
    (b.damage)();
    assert!(matches!(s.get(), Err(MapStoreError::Corrupt(_))));
    // Neither "first map" nor a swap from what the caller once read replaces it.
    assert!(s.swap(None, &map(1, 1000)).is_err());
    assert!(s.swap(Some(&map(1, 1000)), &map(2, 1000)).is_err());
    assert!(matches!(s.get(), Err(MapStoreError::Corrupt(_))));
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod local_backend {
            $(#[test] fn $case() { super::$case(&super::local(stringify!($case))); })*
        }
        mod etcd_backend {
            $(#[test] fn $case() { super::$case(&super::etcd(stringify!($case))); })*
        }
        mod secure_etcd_backend {
            $(#[test] fn $case() { super::$case(&super::secure_etcd(stringify!($case))); })*
        }
    };
}

conformance!(
    first_swap_creates_and_only_once,
    a_stale_swap_conflicts_and_changes_nothing,
    epochs_go_up_by_exactly_one_and_maps_must_be_valid,
    racing_writers_never_share_an_epoch,
    a_waiter_sees_the_next_epoch_and_times_out_without_one,
    a_damaged_map_is_reported_and_never_overwritten,
);

/// An OSD that fell a few epochs behind gets every one in turn from etcd's history (a
/// skipped epoch makes it peer every PG again); one too far behind, or whose history etcd
/// compacted, gets the newest.
#[test]
fn a_waiter_that_fell_behind_gets_every_epoch_in_turn_from_etcd() {
    let dir = TestDir::with_etcd("mapstore-etcd", "replay");
    let ep = vec![dir.endpoint()];
    let writer = EtcdMapStore::new(&ep, "replay").unwrap();
    let waiter = EtcdMapStore::new(&ep, "replay").unwrap();
    writer.swap(None, &map(1, 1000)).unwrap();
    assert_eq!(waiter.get().unwrap().unwrap().epoch, 1);
    for e in 2..=5 {
        writer.swap(Some(&map(e - 1, 1000)), &map(e, 1000)).unwrap();
    }
    let mut seen = Vec::new();
    let mut epoch = 1;
    while let Some(m) = waiter
        .wait_newer(epoch, Duration::from_millis(300))
        .unwrap()
    {
        epoch = m.epoch;
        seen.push(epoch);
    }
    assert_eq!(seen, [2, 3, 4, 5]);

    // Too far behind: the newest at once.
    let last = 5 + carmine_mapstore::REPLAY_EPOCHS_MAX + 1;
    for e in 6..=last {
        writer.swap(Some(&map(e - 1, 1000)), &map(e, 1000)).unwrap();
    }
    let m = waiter
        .wait_newer(5, Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(m.epoch, last);

    // A compacted history: the newest, within the replay's short wait.
    writer
        .swap(Some(&map(last, 1000)), &map(last + 1, 1000))
        .unwrap();
    writer
        .swap(Some(&map(last + 1, 1000)), &map(last + 2, 1000))
        .unwrap();
    let (_, revision) = writer.etcd().get(writer.key()).unwrap();
    let body = serde_json::json!({ "revision": revision.to_string(), "physical": true });
    ureq::post(&format!("{}/v3/kv/compaction", dir.endpoint()))
        .send_string(&body.to_string())
        .unwrap();
    let t = Instant::now();
    let m = waiter
        .wait_newer(last, Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(m.epoch, last + 2);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn an_unreachable_etcd_is_an_error_not_a_hang() {
    let dead = format!("http://{}", carmine_testkit::free_addr());
    let s = EtcdMapStore::new(&[dead], "x").unwrap();
    let t = Instant::now();
    assert!(matches!(s.get(), Err(MapStoreError::Unavailable(_))));
    assert!(matches!(
        s.swap(None, &map(1, 1000)),
        Err(MapStoreError::Unavailable(_))
    ));
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(EtcdMapStore::new(&[], "x").is_err());
    assert!(EtcdMapStore::new(&["ftp://a:1".into()], "x").is_err());
}

/// Whoever lacks one of the secured etcd's requirements is refused with an error that says
/// which, and never reads or changes the map.
#[test]
fn a_secured_etcd_refuses_whoever_lacks_the_ca_the_certificate_or_the_password() {
    let dir = temp_dir("tls-refusals");
    let etcd = PrivateEtcd::start_secure(&dir).unwrap();
    let ep = vec![etcd.endpoint().to_owned()];
    let good = etcd.access().clone();
    EtcdMapStore::with_access(&ep, &good, "c")
        .unwrap()
        .swap(None, &map(1, 1000))
        .unwrap();
    let fails = |access: &EtcdAccess| -> String {
        match EtcdMapStore::with_access(&ep, access, "c").and_then(|s| s.get()) {
            Ok(m) => panic!("read {m:?} with {access:?}"),
            Err(e) => e.to_string(),
        }
    };
    // Plain HTTP to a TLS port.
    let plain = ep[0].replace("https://", "http://");
    assert!(EtcdMapStore::new(&[plain], "c").unwrap().get().is_err());
    // No CA: etcd's certificate is not trusted.
    let e = fails(&EtcdAccess {
        ca: None,
        cert: None,
        key: None,
        ..good.clone()
    });
    assert!(
        e.contains("certificate") || e.contains("UnknownIssuer"),
        "{e}"
    );
    // A CA but no client certificate: etcd requires one.
    let e = fails(&EtcdAccess {
        cert: None,
        key: None,
        ..good.clone()
    });
    assert!(!e.is_empty());
    // Another CA (a second secured etcd's): not etcd's.
    let other_dir = temp_dir("tls-refusals-other");
    let other = PrivateEtcd::start_secure(&other_dir).unwrap();
    let e = fails(&EtcdAccess {
        ca: other.access().ca.clone(),
        ..good.clone()
    });
    assert!(
        e.contains("certificate") || e.contains("UnknownIssuer"),
        "{e}"
    );
    // The client certificate of another CA.
    let e = fails(&EtcdAccess {
        cert: other.access().cert.clone(),
        key: other.access().key.clone(),
        ..good.clone()
    });
    assert!(!e.is_empty());
    // TLS right, no user: etcd auth refuses.
    let e = fails(&EtcdAccess {
        user: None,
        password_file: None,
        ..good.clone()
    });
    assert!(
        e.contains("user name is empty") || e.contains("HTTP 4"),
        "{e}"
    );
    // A wrong password.
    let wrong = dir.join("wrong.password");
    std::fs::write(&wrong, "not-it\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = fails(&EtcdAccess {
        password_file: Some(wrong.clone()),
        ..good.clone()
    });
    assert!(e.contains("refused user \"root\""), "{e}");
    // A password file others may read is refused before anything is sent.
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = fails(&EtcdAccess {
        password_file: Some(wrong),
        ..good.clone()
    });
    assert!(e.contains("chmod 600"), "{e}");
    // The map is still the one written, read with the right access.
    let m = EtcdMapStore::with_access(&ep, &good, "c")
        .unwrap()
        .get()
        .unwrap();
    assert_eq!(m.map(|m| m.epoch), Some(1));
    drop((etcd, other));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other_dir);
}

/// Tokens die (they expire, or etcd forgets them when it restarts or auth is switched off and
/// on): the client authenticates again instead of failing.
#[test]
fn a_dead_token_is_replaced_transparently() {
    let dir = temp_dir("tls-token");
    let etcd = PrivateEtcd::start_secure(&dir).unwrap();
    let ep = vec![etcd.endpoint().to_owned()];
    let client = Etcd::with_access(&ep, etcd.access()).unwrap();
    client.get("/x").unwrap();
    let root = Etcd::with_access(&ep, etcd.access()).unwrap();
    root.disable_auth().unwrap();
    let password = std::fs::read_to_string(etcd.access().password_file.as_ref().unwrap()).unwrap();
    let anonymous = EtcdAccess {
        user: None,
        password_file: None,
        ..etcd.access().clone()
    };
    Etcd::with_access(&ep, &anonymous)
        .unwrap()
        .enable_auth(password.trim())
        .unwrap();
    // `client` still holds the token from before: etcd refuses it, the client logs in again.
    client.get("/x").unwrap();
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}
