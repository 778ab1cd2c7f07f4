//! One writer per volume (issue #10, item 11): racing creates, the exclusive lock, its lease,
//! and fencing of a holder whose lock was broken, against a real in-process OSD.

use bytes::Bytes;
use carmine_client::{Client, ClientConfig};
use carmine_cluster::OsdMap;
use carmine_osd::{Osd, OsdConfig};
use carmine_volume::{LockOptions, VolumeError, Volumes};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_millis(300);

struct Cluster {
    osd: Option<Osd>,
    addrs: Vec<SocketAddr>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(osd) = self.osd.take() {
            let _ = osd.shutdown();
        }
    }
}

fn cluster() -> Cluster {
    let addrs: Vec<SocketAddr> = (0..2).map(|_| carmine_testkit::free_addr()).collect();
    let osd = Osd::start(OsdConfig {
        reactor_cpus: vec![None, None],
        ..OsdConfig::in_memory(0, OsdMap::single_osd(addrs.clone(), 16), 256 << 20)
    })
    .unwrap();
    Cluster {
        osd: Some(osd),
        addrs,
    }
}

/// A separate client: a separate instance, as another gateway or host would be.
async fn volumes(c: &Cluster) -> Volumes {
    let client = Client::connect(&c.addrs, ClientConfig::default())
        .await
        .unwrap();
    Volumes::new(client, 1)
}

/// A 1 MiB volume "vm" of 64 KiB objects, created from a client of its own.
fn create_vm(c: &Cluster) {
    carmine_reactor::block_on(async {
        volumes(c)
            .await
            .create("vm", 1 << 20, Some(64 << 10))
            .await
            .unwrap();
    });
}

fn opts(who: &str) -> LockOptions {
    LockOptions {
        lease: LEASE,
        holder: who.into(),
    }
}

fn block(byte: u8) -> Bytes {
    Bytes::from(vec![byte; 4096])
}

#[test]
fn of_racing_creates_of_one_name_exactly_one_wins() {
    let c = cluster();
    carmine_reactor::block_on(async {
        let mut all = Vec::new();
        for _ in 0..6 {
            all.push(volumes(&c).await);
        }
        for round in 0..10 {
            let name = format!("disk{round}");
            let results = futures::future::join_all(
                all.iter().map(|v| v.create(&name, (round + 1) << 20, None)),
            )
            .await;
            let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
            assert_eq!(won.len(), 1, "round {round}: {results:?}");
            for r in &results {
                assert!(
                    matches!(r, Ok(_) | Err(VolumeError::Exists { .. })),
                    "round {round}: {r:?}"
                );
            }
            // The name resolves to the winner's image, from any client.
            let info = all[5].info(&name).await.unwrap();
            assert_eq!(&info, won[0]);
        }
        assert_eq!(all[0].list().await.unwrap().len(), 10);
    });
}

#[test]
fn a_live_holder_keeps_the_volume_and_blocks_other_writers_resize_and_rm() {
    let c = cluster();
    carmine_reactor::block_on(async {
        let a = volumes(&c).await;
        let b = volumes(&c).await;
        a.create("vm", 1 << 20, Some(64 << 10)).await.unwrap();
        let img = a.open_with("vm", &opts("gateway A")).await.unwrap();
        img.write(0, block(1)).await.unwrap();
        // B watches for a lease: A renews meanwhile, so B is refused, naming A.
        let t = Instant::now();
        match b.open_with("vm", &opts("gateway B")).await {
            Err(VolumeError::Locked { holder, .. }) => assert_eq!(holder, "gateway A"),
            other => panic!("second writer was not refused: {:?}", other.map(|_| ())),
        }
        assert!(t.elapsed() < LEASE * 2, "refusal took {:?}", t.elapsed());
        assert!(matches!(
            b.resize("vm", 2 << 20).await,
            Err(VolumeError::Locked { .. })
        ));
        assert!(matches!(
            b.remove("vm").await,
            Err(VolumeError::Locked { .. })
        ));
        // A was never disturbed, across several leases of renewals.
        carmine_reactor::sleep(LEASE * 3).await;
        img.write(4096, block(2)).await.unwrap();
        let holder = b.lock_holder("vm").await.unwrap().unwrap();
        assert_eq!(holder.holder, "gateway A");
        assert!(holder.renewals >= 3, "renewed {} times", holder.renewals);
        // Reading does not need the lock.
        let ro = b.open_read_only("vm").await.unwrap();
        assert_eq!(ro.read(4096, 4096).await.unwrap(), block(2));
        assert!(matches!(
            ro.write(0, block(9)).await,
            Err(VolumeError::ReadOnly { .. })
        ));
        // Once A closes, B gets it at once (no lease to wait out) and can remove the volume.
        img.clone().close().await.unwrap();
        assert!(matches!(
            img.write(0, block(3)).await,
            Err(VolumeError::LockLost { .. })
        ));
        // The record is gone, so B has no lease to wait out (a bound on B's open time could
        // not tell the two apart on a loaded 2-core machine: 375 ms was seen without a wait).
        assert!(b.lock_holder("vm").await.unwrap().is_none());
        let img_b = b.open_with("vm", &opts("gateway B")).await.unwrap();
        assert_eq!(img_b.read(0, 4096).await.unwrap(), block(1));
        img_b.close().await.unwrap();
        b.remove("vm").await.unwrap();
        assert!(b.list().await.unwrap().is_empty());
    });
}

/// Gateway A opens the volume on its own thread, writes, then hangs (its thread blocks: no
/// renewals, as a paused VM or a stopped process). B takes over after a lease, fencing A.
/// When A wakes up, its writes fail: it never overwrites what B wrote.
#[test]
fn a_hung_holder_is_fenced_and_its_late_writes_never_land() {
    let c = cluster();
    let addrs = c.addrs.clone();
    create_vm(&c);
    let (opened_tx, opened_rx) = mpsc::channel::<()>();
    let (wake_tx, wake_rx) = mpsc::channel::<()>();
    let a = std::thread::spawn(move || {
        carmine_reactor::block_on(async move {
            let client = Client::connect(&addrs, ClientConfig::default())
                .await
                .unwrap();
            let v = Volumes::new(client, 1);
            let img = v.open_with("vm", &opts("gateway A")).await.unwrap();
            img.write(0, block(0xa1)).await.unwrap();
            opened_tx.send(()).unwrap();
            // Hung: the whole reactor thread is blocked, the renewal task cannot run.
            wake_rx.recv().unwrap();
            let late = img.write(0, block(0xa2)).await;
            let late_discard = img.discard(0, 65536).await;
            let flush = img.flush().await;
            (
                late.map_err(|e| e.to_string()),
                late_discard.is_err(),
                flush.is_err(),
            )
        })
    });
    opened_rx.recv().unwrap();
    carmine_reactor::block_on(async {
        let b = volumes(&c).await;
        let t = Instant::now();
        let img = b.open_with("vm", &opts("gateway B")).await.unwrap();
        let waited = t.elapsed();
        assert!(
            waited >= LEASE,
            "took the lock of a holder without waiting a lease: {waited:?}"
        );
        assert_eq!(img.read(0, 4096).await.unwrap(), block(0xa1));
        img.write(0, block(0xb1)).await.unwrap();
        wake_tx.send(()).unwrap();
        let (late, discard_failed, flush_failed) = a.join().unwrap();
        let err = late.expect_err("the fenced holder's write succeeded");
        assert!(err.contains("lock lost"), "{err}");
        assert!(discard_failed && flush_failed);
        // B's data stands; B keeps working.
        assert_eq!(img.read(0, 4096).await.unwrap(), block(0xb1));
        img.write(4096, block(0xb2)).await.unwrap();
        let holder = b.lock_holder("vm").await.unwrap().unwrap();
        assert_eq!(holder.holder, "gateway B");
    });
}

#[test]
fn breaking_a_lock_fences_its_holder_at_once() {
    let c = cluster();
    carmine_reactor::block_on(async {
        let a = volumes(&c).await;
        let op = volumes(&c).await;
        a.create("vm", 1 << 20, None).await.unwrap();
        let img = a.open_with("vm", &opts("gateway A")).await.unwrap();
        img.write(0, block(1)).await.unwrap();
        let broken = op.break_lock("vm").await.unwrap().unwrap();
        assert_eq!(broken.holder, "gateway A");
        assert!(op.lock_holder("vm").await.unwrap().is_none());
        match img.write(0, block(2)).await {
            Err(VolumeError::LockLost { .. }) => {}
            other => panic!("a broken holder could still write: {other:?}"),
        }
        // Later writes fail without reaching the OSD, and so does a flush.
        assert!(img.write(8192, block(3)).await.is_err());
        assert!(img.flush().await.is_err());
        // The operator's client now opens it without waiting.
        let t = Instant::now();
        let mine = op.open_with("vm", &opts("operator")).await.unwrap();
        assert!(t.elapsed() < LEASE);
        assert_eq!(mine.read(0, 4096).await.unwrap(), block(1));
        assert!(op.break_lock("nope").await.is_err());
    });
}

#[test]
fn a_holder_that_dropped_its_image_is_taken_over_after_one_lease() {
    let c = cluster();
    carmine_reactor::block_on(async {
        let a = volumes(&c).await;
        a.create("vm", 1 << 20, None).await.unwrap();
        let img = a.open_with("vm", &opts("short-lived tool")).await.unwrap();
        img.write(0, block(7)).await.unwrap();
        drop(img);
        // The same client opens again at once: its own lock.
        let again = a.open_with("vm", &opts("same tool")).await.unwrap();
        drop(again);
        let b = volumes(&c).await;
        let t = Instant::now();
        let img = b.open_with("vm", &opts("gateway B")).await.unwrap();
        assert!(t.elapsed() >= LEASE, "{:?}", t.elapsed());
        assert_eq!(img.read(0, 4096).await.unwrap(), block(7));
    });
}

/// A lock held on one reactor thread and shared with another (`open_shared`, as `nbd serve
/// --reactors N` does): the sharer writes as the same client instance, refuses an instance
/// that is not the holder's, and stops writing — without asking any OSD — once the holder
/// closes the image, or drops it without closing.
#[test]
fn a_shared_lock_stops_its_sharers_when_the_holder_closes_or_drops_it() {
    use carmine_client::SharedInstance;
    let c = cluster();
    let addrs = c.addrs.clone();
    create_vm(&c);
    for dropped in [false, true] {
        let (share_tx, share_rx) = mpsc::channel();
        let (written_tx, written_rx) = mpsc::channel::<()>();
        let (closed_tx, closed_rx) = mpsc::channel::<()>();
        let holder_addrs = addrs.clone();
        let holder = std::thread::spawn(move || {
            carmine_reactor::block_on(async move {
                let client = Client::connect(&holder_addrs, ClientConfig::default())
                    .await
                    .unwrap();
                let instance = client.instance();
                let img = Volumes::new(client, 1)
                    .open_with("vm", &opts("holder"))
                    .await
                    .unwrap();
                share_tx
                    .send((instance, img.lock_share().unwrap()))
                    .unwrap();
                written_rx.recv().unwrap();
                if dropped {
                    drop(img);
                } else {
                    img.close().await.unwrap();
                }
                closed_tx.send(()).unwrap();
            })
        });
        let (instance, share) = share_rx.recv().unwrap();
        carmine_reactor::block_on(async {
            // Another instance may not write under the share.
            let stranger = volumes(&c).await;
            assert!(stranger.open_shared("vm", share.clone()).await.is_err());
            let cfg = ClientConfig {
                instance: Some(SharedInstance {
                    id: instance,
                    lane: 1,
                }),
                ..ClientConfig::default()
            };
            let client = Client::connect(&addrs, cfg).await.unwrap();
            let sharer = Volumes::new(client, 1)
                .open_shared("vm", share)
                .await
                .unwrap();
            sharer.write(0, block(0x51)).await.unwrap();
            assert_eq!(sharer.read(0, 4096).await.unwrap(), block(0x51));
            written_tx.send(()).unwrap();
            closed_rx.recv().unwrap();
            let err = sharer
                .write(0, block(0x52))
                .await
                .expect_err("a sharer wrote after its holder let the lock go");
            assert!(matches!(err, VolumeError::LockLost { .. }), "{err}");
            assert_eq!(sharer.read(0, 4096).await.unwrap(), block(0x51));
        });
        holder.join().unwrap();
    }
}
