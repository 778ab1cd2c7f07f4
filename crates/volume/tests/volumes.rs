//! Volumes against a real in-process OSD over TCP.

use bytes::Bytes;
use carmine_client::{Client, ClientConfig};
use carmine_cluster::{OsdInfo, OsdMap, Pool};
use carmine_osd::{Osd, OsdConfig};
use carmine_volume::{VolumeError, Volumes};

fn with_volumes<F, Fut>(f: F)
where
    F: FnOnce(Volumes) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    with_two_clients(|v, _| f(v))
}

/// Two clients of one OSD, as two processes would be.
fn with_two_clients<F, Fut>(f: F)
where
    F: FnOnce(Volumes, Volumes) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut addrs = vec![carmine_testkit::free_addr()];
    while addrs.len() < 2 {
        let addr = carmine_testkit::free_addr();
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    let map = OsdMap {
        epoch: 1,
        osds: vec![OsdInfo::new(0, "localhost", addrs.clone())],
        pools: vec![Pool {
            id: 1,
            name: "rbd".into(),
            pg_num: 32,
            size: 1,
            min_size: 1,
        }],
        upmaps: Default::default(),
        pg_temp: Default::default(),
        pool_max: 1,
        given_copies: Default::default(),
    };
    let osd = Osd::start(OsdConfig {
        reactor_cpus: vec![None, None],
        ..OsdConfig::in_memory(0, map, 256 << 20)
    })
    .unwrap();
    carmine_reactor::block_on(async {
        let client = Client::connect(&addrs, ClientConfig::default())
            .await
            .unwrap();
        let other = Client::connect(&addrs, ClientConfig::default())
            .await
            .unwrap();
        f(Volumes::new(client, 1), Volumes::new(other, 1)).await;
    });
    osd.shutdown().unwrap();
}

fn pattern(len: usize, salt: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
            .collect::<Vec<u8>>(),
    )
}

#[test]
fn create_list_info_resize_remove() {
    with_volumes(|v| async move {
        assert!(v.list().await.unwrap().is_empty());
        v.create("b", 1 << 20, None).await.unwrap();
        v.create("a", 8 << 20, Some(64 << 10)).await.unwrap();
        assert_eq!(v.list().await.unwrap(), vec!["a", "b"]);
        let info = v.info("a").await.unwrap();
        assert_eq!((info.size, info.object_size), (8 << 20, 64 << 10));
        assert!(matches!(
            v.create("a", 1, None).await,
            Err(VolumeError::Exists { .. })
        ));
        v.resize("a", 16 << 20).await.unwrap();
        assert_eq!(v.info("a").await.unwrap().size, 16 << 20);
        v.remove("a").await.unwrap();
        assert_eq!(v.list().await.unwrap(), vec!["b"]);
        assert!(matches!(
            v.info("a").await,
            Err(VolumeError::NotFound { .. })
        ));
        assert!(matches!(
            v.remove("a").await,
            Err(VolumeError::NotFound { .. })
        ));
    });
}

#[test]
fn unaligned_io_spanning_objects_reads_back_exactly() {
    with_volumes(|v| async move {
        let img = v.create("x", 1 << 20, Some(4096)).await.unwrap();
        let img = v.open(&img.name).await.unwrap();
        let data = pattern(50_001, 3);
        img.write(12_345, data.clone()).await.unwrap();
        assert_eq!(img.read(12_345, data.len() as u64).await.unwrap(), data);
        // The bytes around the write are still zeros.
        let around = img.read(12_000, 345).await.unwrap();
        assert!(around.iter().all(|b| *b == 0));
        let after = img.read(12_345 + 50_001, 100).await.unwrap();
        assert!(after.iter().all(|b| *b == 0));
    });
}

#[test]
fn unwritten_ranges_read_as_zeros() {
    with_volumes(|v| async move {
        let img = v
            .open(&v.create("z", 64 << 20, None).await.unwrap().name)
            .await
            .unwrap();
        let data = img.read(10 << 20, 9 << 20).await.unwrap();
        assert_eq!(data.len(), 9 << 20);
        assert!(data.iter().all(|b| *b == 0));
    });
}

#[test]
fn discard_and_write_zeroes_make_ranges_read_zero() {
    with_volumes(|v| async move {
        let img = v
            .open(&v.create("d", 1 << 20, Some(64 << 10)).await.unwrap().name)
            .await
            .unwrap();
        img.write(0, pattern(1 << 20, 9)).await.unwrap();
        // Whole objects (removed) plus partial ones (zeroed).
        img.discard(1000, 200_000).await.unwrap();
        img.write_zeroes(500_000, 10).await.unwrap();
        let all = img.read(0, 1 << 20).await.unwrap();
        let expect = pattern(1 << 20, 9);
        for (i, (a, e)) in all.iter().zip(expect.iter()).enumerate() {
            let zeroed = (1000..201_000).contains(&i) || (500_000..500_010).contains(&i);
            assert_eq!(*a, if zeroed { 0 } else { *e }, "byte {i}");
        }
    });
}

#[test]
fn io_beyond_the_end_is_rejected() {
    with_volumes(|v| async move {
        let img = v
            .open(&v.create("e", 1 << 20, None).await.unwrap().name)
            .await
            .unwrap();
        assert!(matches!(
            img.write((1 << 20) - 1, Bytes::from_static(b"ab")).await,
            Err(VolumeError::OutOfRange { .. })
        ));
        assert!(matches!(
            img.read(1 << 20, 1).await,
            Err(VolumeError::OutOfRange { .. })
        ));
        assert!(matches!(
            img.read(u64::MAX, 2).await,
            Err(VolumeError::OutOfRange { .. })
        ));
        assert!(matches!(
            img.discard(0, (1 << 20) + 1).await,
            Err(VolumeError::OutOfRange { .. })
        ));
        img.write((1 << 20) - 2, Bytes::from_static(b"ab"))
            .await
            .unwrap();
    });
}

#[test]
fn shrinking_discards_data_past_the_new_end() {
    with_volumes(|v| async move {
        let img = v
            .open(&v.create("s", 1 << 20, Some(64 << 10)).await.unwrap().name)
            .await
            .unwrap();
        img.write(0, pattern(1 << 20, 1)).await.unwrap();
        v.resize("s", 100_000).await.unwrap();
        v.resize("s", 1 << 20).await.unwrap();
        let img = v.open("s").await.unwrap();
        let all = img.read(0, 1 << 20).await.unwrap();
        assert_eq!(&all[..100_000], &pattern(1 << 20, 1)[..100_000]);
        assert!(
            all[100_000..].iter().all(|b| *b == 0),
            "data past the shrink point survived"
        );
    });
}

#[test]
fn bad_names_and_object_sizes_are_rejected() {
    with_volumes(|v| async move {
        assert!(matches!(
            v.create("", 1, None).await,
            Err(VolumeError::InvalidName { .. })
        ));
        assert!(matches!(
            v.create("a/b", 1, None).await,
            Err(VolumeError::InvalidName { .. })
        ));
        assert!(matches!(
            v.create("ok", 1, Some(3000)).await,
            Err(VolumeError::InvalidArgument(_))
        ));
        assert!(matches!(
            v.open("missing").await,
            Err(VolumeError::NotFound { .. })
        ));
    });
}

#[test]
fn a_removal_cut_short_hides_the_whole_image_and_is_finished_later() {
    with_volumes(|v| async move {
        let info = v.create("doomed", 1 << 20, Some(64 << 10)).await.unwrap();
        let image = v.open("doomed").await.unwrap();
        image.write(0, pattern(1 << 20, 5)).await.unwrap();
        v.create("other", 1 << 20, None).await.unwrap();
        // A crash right after the first step of `remove`: the image is gone as a whole,
        // nothing half-removed is ever listed or opened.
        v.begin_remove("doomed", &info.id).await.unwrap();
        assert_eq!(v.list().await.unwrap(), vec!["other"]);
        assert!(matches!(
            v.open("doomed").await,
            Err(VolumeError::NotFound { .. })
        ));
        let data = format!("carmine_data.{}.{:016x}", info.id, 3);
        let client = v.client().clone();
        assert!(
            client.stat(1, &data).await.is_ok(),
            "data went before the name"
        );
        // The next removal of anything finishes it: data and header go, no trash is left.
        v.remove("other").await.unwrap();
        assert_eq!(
            client.stat(1, &data).await.unwrap_err().status(),
            Some(carmine_proto::Status::ObjectNotFound)
        );
        assert_eq!(v.purge_trash().await.unwrap(), 0);
        assert!(v.list().await.unwrap().is_empty());
    });
}

/// A copier stopped half way (its future dropped at an await, as a killed process stops)
/// leaves a destination that every open refuses, never a volume that reads partly as zeros;
/// after the source's lock is broken, the partial copy removed and the copy made again,
/// the copy opens and reads as the source.
#[test]
fn a_copy_cut_short_is_refused_by_every_open_until_removed_and_made_again() {
    use futures::FutureExt;
    use std::cell::Cell;
    with_two_clients(|v, copier| async move {
        v.create("src", 4 << 20, Some(64 << 10)).await.unwrap();
        let data = pattern(4 << 20, 9);
        let img = v.open("src").await.unwrap();
        img.write(0, data.clone()).await.unwrap();
        img.close().await.unwrap();

        let copied = Cell::new(0u64);
        {
            let copy = copier
                .copy_to("src", &copier, "dst", 1, |n| copied.set(copied.get() + n))
                .fuse();
            let cut = async {
                while copied.get() < 8 * (64 << 10) {
                    carmine_reactor::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            .fuse();
            futures::pin_mut!(copy, cut);
            futures::select! {
                r = copy => panic!("the copy ended before it was cut: {r:?}"),
                () = cut => {}
            }
        }
        assert!(copied.get() < 4 << 20, "cut half way");
        assert_eq!(v.list().await.unwrap(), vec!["dst", "src"]);
        assert!(v.info("dst").await.unwrap().is_incomplete());
        for refused in [
            v.open("dst").await.err(),
            v.open_read_only("dst").await.err(),
        ] {
            assert!(
                matches!(refused, Some(VolumeError::Incomplete { .. })),
                "{refused:?}"
            );
        }
        // Nor may a resize make it look complete.
        assert!(matches!(
            v.resize("dst", 8 << 20).await,
            Err(VolumeError::Incomplete { .. })
        ));
        // The copier's locks on the source and the copy outlive it until their lease (a
        // `remove` would wait for it): broken by hand.
        assert!(v.break_lock("src").await.unwrap().is_some());
        assert!(v.break_lock("dst").await.unwrap().is_some());
        v.remove("dst").await.unwrap();
        let c = v.copy_to("src", &v, "dst", 4, |_| {}).await.unwrap();
        assert_eq!(c.objects, 64);
        assert!(!v.info("dst").await.unwrap().is_incomplete());
        let dst = v.open_read_only("dst").await.unwrap();
        assert_eq!(dst.read(0, 4 << 20).await.unwrap(), data);
    });
}
