//! Conditional writes (compares, exclusive creates, removes) on a replicated pool while its
//! epochs and intervals change under them: each applies exactly once, on every copy alike.
//! Native stores, so the store's own writes take time and an epoch can change during one.

mod common;
use common::*;

use bytes::Bytes;
use carmine_client::Client;
use carmine_cluster::OsdMap;
use carmine_mapstore::LocalPgHistory;
use carmine_nativestore::{FileDevice, NativeConfig, SyncMode};
use carmine_osd::{Osd, OsdConfig, StoreConfig};
use carmine_proto::{OpOutput, OsdOp};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A native store device file for `osd`, formatted for one reactor.
fn device(dir: &Path, osd: u32) -> PathBuf {
    let path = dir.join(format!("osd{osd}.dev"));
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(256 << 20).unwrap();
    drop(f);
    carmine_reactor::block_on(async {
        let dev = FileDevice::open(&path, SyncMode::Fdatasync).await.unwrap();
        carmine_nativestore::mkfs(&dev, 1, 8 << 20).await.unwrap();
    });
    path
}

fn start_native(id: u32, map: &OsdMap, histories: &Path, device: &Path) -> Osd {
    Osd::start(OsdConfig {
        store: StoreConfig::Native {
            device: device.to_path_buf(),
            config: NativeConfig::default(),
            sync: SyncMode::Fdatasync,
        },
        pg_history: Some(Arc::new(LocalPgHistory::new(histories))),
        ..OsdConfig::in_memory(id, map.clone(), 0)
    })
    .unwrap()
}

/// What one object should hold: its generation xattr and its data.
#[derive(Default)]
struct Expected {
    exists: bool,
    generation: u64,
    data: Vec<u8>,
}

fn generation(g: u64) -> Bytes {
    Bytes::copy_from_slice(&g.to_le_bytes())
}

/// Steps one object through guarded changes, one at a time, until `stop`: each step's
/// compare holds only if every earlier acknowledged step applied exactly once, and none after.
async fn steps(c: &Client, oid: String, stop: Arc<AtomicBool>) -> (Expected, u64) {
    let mut want = Expected::default();
    let mut done = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let g = want.generation;
        let guard = OsdOp::CmpXattr {
            name: "gen".into(),
            value: Some(generation(g)),
        };
        let stamp = Bytes::copy_from_slice(&(g + 1).to_le_bytes());
        let ops = if !want.exists {
            vec![
                OsdOp::Create { exclusive: true },
                OsdOp::SetXattr {
                    name: "gen".into(),
                    value: generation(g + 1),
                },
                OsdOp::Write {
                    off: 0,
                    data: stamp.clone(),
                },
            ]
        } else if g % 8 == 7 {
            vec![guard, OsdOp::Remove]
        } else {
            vec![
                guard,
                OsdOp::SetXattr {
                    name: "gen".into(),
                    value: generation(g + 1),
                },
                OsdOp::Write {
                    off: want.data.len() as u64,
                    data: stamp.clone(),
                },
            ]
        };
        let removing = matches!(ops.last(), Some(OsdOp::Remove));
        if let Err(e) = c.execute(1, &oid, ops).await {
            panic!("{oid}: step {done} from generation {g} failed: {e}");
        }
        done += 1;
        if removing {
            // The next create goes on from the generation the object had.
            want = Expected {
                generation: g + 1,
                ..Expected::default()
            };
            continue;
        }
        if !want.exists {
            want.exists = true;
            want.data.clear();
        }
        want.data.extend_from_slice(&stamp);
        want.generation = g + 1;
    }
    (want, done)
}

#[test]
fn conditional_writes_apply_once_and_alike_on_every_copy_while_epochs_change() {
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("conditional");
    let mut map = three_osd_map(1);
    let devices: Vec<PathBuf> = (0..3).map(|id| device(dir.path(), id)).collect();
    let histories = dir.path().join("histories");
    std::fs::create_dir_all(&histories).unwrap();
    let mut osds: Vec<Option<Osd>> = (0..3)
        .map(|id| Some(start_native(id, &map, &histories, &devices[id as usize])))
        .collect();
    wait_settled(&map, &histories);
    const OBJECTS: usize = 16;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (map, stop) = (map.clone(), stop.clone());
        std::thread::spawn(move || {
            carmine_reactor::block_on(async move {
                let c = client(&map, Duration::from_secs(30)).await;
                let all = (0..OBJECTS).map(|i| steps(&c, format!("guarded{i}"), stop.clone()));
                futures::future::join_all(all).await
            })
        })
    };
    let pause = |ms| std::thread::sleep(Duration::from_millis(ms));
    for round in 0..6u32 {
        pause(150);
        assert!(!writer.is_finished(), "the writer stopped");
        // A new epoch that changes no interval: the PGs go on in it.
        next(&mut map, |_| {});
        hand_out(&mut osds, &map);
        pause(150);
        // One OSD leaves the acting sets while it runs, then comes back and catches up.
        let osd = (round % 3) as usize;
        next(&mut map, |m| m.osds[osd].up = false);
        hand_out(&mut osds, &map);
        pause(300);
        next(&mut map, |m| m.osds[osd].up = true);
        publish(&mut osds, &map, &histories);
    }
    stop.store(true, Ordering::Relaxed);
    let results = writer.join().expect("a guarded write failed");
    let total: u64 = results.iter().map(|(_, n)| n).sum();
    eprintln!("{total} guarded writes over {} epochs", map.epoch);
    assert!(
        total >= OBJECTS as u64 * 4,
        "too few writes to mean anything: {total}"
    );
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(30)).await;
        for (i, (want, _)) in results.iter().enumerate() {
            let oid = format!("guarded{i}");
            let got = c
                .execute(
                    1,
                    &oid,
                    vec![
                        OsdOp::Read { off: 0, len: 0 },
                        OsdOp::GetXattr { name: "gen".into() },
                    ],
                )
                .await;
            if !want.exists {
                assert_eq!(refused(got), carmine_proto::Status::ObjectNotFound, "{oid}");
                continue;
            }
            match &got.unwrap_or_else(|e| panic!("{oid}: {e}"))[..] {
                [OpOutput::Data(d), OpOutput::Value(g)] => {
                    assert_eq!(&d[..], &want.data[..], "{oid} data");
                    assert_eq!(g, &generation(want.generation), "{oid} generation");
                }
                other => panic!("{oid}: {other:?}"),
            }
        }
        // Every copy alike.
        for seed in 0..map.pools[0].pg_num {
            let report = findings(&c, seed, 0).await;
            assert_eq!(report.acting.len(), 3, "pg {seed}: {report:?}");
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

fn refused<T: std::fmt::Debug>(r: Result<T, carmine_client::ClientError>) -> carmine_proto::Status {
    r.expect_err("expected the request to be refused")
        .status()
        .expect("expected an answer from the OSD")
}

#[test]
fn failed_compares_creates_and_removes_change_no_copy() {
    use carmine_proto::Status;
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("conditional-fail");
    let map = three_osd_map(1);
    let osds = start_all_settled(&map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        let set = |g: u64| OsdOp::SetXattr {
            name: "gen".into(),
            value: generation(g),
        };
        let guard = |g: u64| OsdOp::CmpXattr {
            name: "gen".into(),
            value: Some(generation(g)),
        };
        let write = |b: &'static [u8]| OsdOp::WriteFull {
            data: Bytes::from_static(b),
        };
        c.execute(1, "obj", vec![set(1), write(b"one")])
            .await
            .unwrap();
        // A stale compare changes nothing; a current one applies.
        let stale = c.execute(1, "obj", vec![guard(0), set(2), write(b"two")]);
        assert_eq!(refused(stale.await), Status::CompareFailed);
        assert_eq!(&c.read(1, "obj", 0, 0).await.unwrap()[..], b"one");
        c.execute(1, "obj", vec![guard(1), set(2), write(b"two")])
            .await
            .unwrap();
        // An exclusive create of what exists, removals of what does not.
        let excl = c.execute(1, "obj", vec![OsdOp::Create { exclusive: true }]);
        assert_eq!(refused(excl.await), Status::Exists);
        let rm = c.execute(1, "nothing", vec![OsdOp::Remove]);
        assert_eq!(refused(rm.await), Status::ObjectNotFound);
        let rmx = c.execute(1, "nothing", vec![OsdOp::RmXattr { name: "a".into() }]);
        assert_eq!(refused(rmx.await), Status::ObjectNotFound);
        // Compares alone change nothing, and create nothing.
        let absent = OsdOp::CmpXattr {
            name: "gen".into(),
            value: None,
        };
        c.execute(1, "ghost", vec![absent]).await.unwrap();
        assert_eq!(refused(c.stat(1, "ghost").await), Status::ObjectNotFound);
        c.execute(1, "obj", vec![guard(2)]).await.unwrap();
        assert_eq!(
            refused(c.execute(1, "obj", vec![guard(1)]).await),
            Status::CompareFailed
        );
        // Racing exclusive creates on separate connections: exactly one wins, every round.
        let mut racers = Vec::new();
        for _ in 0..6 {
            racers.push(client(&map, Duration::from_secs(10)).await);
        }
        for round in 0..10 {
            let oid = format!("contended{round}");
            let all = racers.iter().enumerate().map(|(i, r)| {
                let oid = oid.clone();
                async move {
                    r.execute(
                        1,
                        &oid,
                        vec![
                            OsdOp::Create { exclusive: true },
                            OsdOp::WriteFull {
                                data: Bytes::from(vec![i as u8; 64]),
                            },
                        ],
                    )
                    .await
                }
            });
            let results = futures::future::join_all(all).await;
            let winners: Vec<usize> = (0..results.len()).filter(|i| results[*i].is_ok()).collect();
            assert_eq!(winners.len(), 1, "round {round}: {results:?}");
            for r in results.into_iter().filter(|r| r.is_err()) {
                assert_eq!(refused(r), Status::Exists);
            }
            let data = c.read(1, &oid, 0, 0).await.unwrap();
            assert_eq!(&data[..], &[winners[0] as u8; 64][..], "round {round}");
        }
        // Every copy alike.
        for seed in 0..map.pools[0].pg_num {
            let report = findings(&c, seed, 0).await;
            assert_eq!(report.acting.len(), 3, "pg {seed}: {report:?}");
        }
    });
    for o in osds {
        o.shutdown().unwrap();
    }
}

/// Plain writes that come while a conditional write holds its PG's gate (it waits there for
/// the writes before it to be durable) wait for it, then all go on. Each round: eight plain
/// writes in flight, a conditional write that must wait for them, and eight more plain
/// writes behind it. (Plain writes that found the gate busy once handed it to each other for
/// ever, their reactor spinning, and no round ended.)
#[test]
fn plain_writes_that_meet_a_conditional_write_at_the_gate_all_go_on() {
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("gate");
    let map = three_osd_map(1);
    let osds = start_all_settled(&map, dir.path());
    let pool = &map.pools[0];
    let guarded = "guarded";
    let pg = map.object_pg(pool, guarded);
    let plain: Vec<&'static str> = (0..10_000)
        .map(|i| &*format!("p{i}").leak())
        .filter(|oid| map.object_pg(pool, oid) == pg)
        .take(16)
        .collect();
    let (before, behind) = plain.split_at(8);
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        let set = |g: u64| OsdOp::SetXattr {
            name: "gen".into(),
            value: generation(g),
        };
        c.execute(1, guarded, vec![set(0)]).await.unwrap();
        for round in 0..20u64 {
            let data = Bytes::from(vec![round as u8; 4096]);
            let put = |oid: &'static str| {
                c.execute(1, oid, vec![OsdOp::WriteFull { data: data.clone() }])
            };
            let guard = OsdOp::CmpXattr {
                name: "gen".into(),
                value: Some(generation(round)),
            };
            // Polled, and so sent, in this order.
            let all = futures::future::join3(
                futures::future::join_all(before.iter().copied().map(put)),
                c.execute(1, guarded, vec![guard, set(round + 1)]),
                futures::future::join_all(behind.iter().copied().map(put)),
            );
            let (first, conditional, then) = carmine_reactor::timeout(Duration::from_secs(20), all)
                .await
                .unwrap_or_else(|_| panic!("round {round}: writes never answered"));
            conditional.unwrap();
            for r in first.into_iter().chain(then) {
                r.unwrap();
            }
        }
        let got = c
            .execute(1, guarded, vec![OsdOp::GetXattr { name: "gen".into() }])
            .await
            .unwrap();
        assert!(
            matches!(&got[..], [OpOutput::Value(g)] if g == &generation(20)),
            "{got:?}"
        );
    });
    for o in osds {
        o.shutdown().unwrap();
    }
}
