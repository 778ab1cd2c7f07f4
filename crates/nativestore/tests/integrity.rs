//! Format checks at mount, checksum errors on read and in fsck, the cleaner at high fill,
//! and a full store.

use bytes::Bytes;
use carmine_nativestore::{
    fsck, mkfs, read_superblock, FormatError, MountError, NativeConfig, NativeStore, SimDevice,
    BLOCK,
};
use carmine_store::{ObjectStore, StoreErrorKind, Transaction};
use carmine_types::{CollectionId, PgId};
use futures::executor::block_on;
use rand::{Rng, SeedableRng};

const C: CollectionId = PgId { pool: 1, seed: 0 };

fn formatted(size: usize, segment: u32) -> SimDevice {
    let dev = SimDevice::new(size);
    block_on(mkfs(&dev, 1, segment)).unwrap();
    dev
}

fn mount(dev: &SimDevice, config: NativeConfig) -> NativeStore<SimDevice> {
    block_on(NativeStore::mount(dev.clone(), 0, config)).unwrap()
}

fn submit(
    store: &NativeStore<SimDevice>,
    build: impl FnOnce(&mut Transaction),
) -> Result<(), StoreErrorKind> {
    let mut t = Transaction::new();
    build(&mut t);
    block_on(store.submit(t)).map_err(|e| {
        if e.kind == StoreErrorKind::Io {
            panic!("unexpected I/O error: {e}");
        }
        e.kind
    })
}

fn block(byte: u8) -> Bytes {
    Bytes::from(vec![byte; BLOCK])
}

#[test]
fn mount_refuses_a_device_that_is_not_a_store() {
    let blank = SimDevice::new(8 << 20);
    let err = block_on(NativeStore::mount(blank, 0, NativeConfig::default()))
        .err()
        .unwrap();
    assert!(matches!(err, MountError::NotAStore), "{err}");
    assert!(
        err.to_string().contains("no Carmine native store here"),
        "{err}"
    );
}

#[test]
fn mount_refuses_a_damaged_superblock_and_a_missing_shard() {
    let dev = formatted(16 << 20, 1 << 20);
    let err = block_on(NativeStore::mount(dev.clone(), 1, NativeConfig::default()))
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            MountError::NoSuchShard {
                shard: 1,
                shards: 1
            }
        ),
        "{err}"
    );
    dev.flip_bit(20, 3);
    dev.flip_bit(carmine_nativestore::SUPER_BACKUP_OFFSET + 20, 3);
    let err = block_on(NativeStore::mount(dev, 0, NativeConfig::default()))
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            MountError::SuperblockDamaged {
                primary: FormatError::Checksum("superblock"),
                backup: FormatError::Checksum("superblock"),
            }
        ),
        "{err}"
    );
}

#[test]
fn mkfs_splits_the_device_into_independent_shards() {
    let dev = SimDevice::new(64 << 20);
    let sb = block_on(mkfs(&dev, 3, 1 << 20)).unwrap();
    assert_eq!(sb.shards.len(), 3);
    assert_eq!(block_on(read_superblock(&dev)).unwrap(), sb);
    let shards: Vec<_> = (0..3)
        .map(|i| block_on(NativeStore::mount(dev.clone(), i, NativeConfig::default())).unwrap())
        .collect();
    for (i, s) in shards.iter().enumerate() {
        let mut t = Transaction::new();
        t.create_collection(C).write(C, "o", 0, block(i as u8 + 1));
        block_on(s.submit(t)).unwrap();
    }
    drop(shards);
    for i in 0..3u8 {
        let s = block_on(NativeStore::mount(
            dev.clone(),
            i as u32,
            NativeConfig::default(),
        ))
        .unwrap();
        assert_eq!(block_on(s.read(C, "o", 0, 0)).unwrap(), block(i + 1));
    }
}

#[test]
fn a_flipped_bit_is_an_error_on_read_and_in_fsck_never_data() {
    let dev = formatted(16 << 20, 1 << 20);
    let no_cache = NativeConfig {
        cache_bytes: 0,
        ..NativeConfig::default()
    };
    let store = mount(&dev, no_cache);
    submit(&store, |t| {
        t.create_collection(C)
            .write(C, "victim", 0, block(0xab))
            .write(C, "other", 0, block(1));
    })
    .unwrap();
    block_on(store.close()).unwrap();
    drop(store);
    // Find the victim's block on the device by its content.
    let image = dev.image();
    let at = image
        .chunks(BLOCK)
        .position(|b| b.iter().all(|&x| x == 0xab))
        .expect("data block on the device");
    dev.flip_bit((at * BLOCK + 100) as u64, 0);
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(report.errors[0].contains("victim"), "{:?}", report.errors);
    let store = mount(&dev, no_cache);
    let err = block_on(store.read(C, "victim", 0, 0)).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert_eq!(store.stats().checksum_errors, 1);
    assert_eq!(block_on(store.read(C, "other", 0, 0)).unwrap(), block(1));
    // Overwriting the damaged block heals the object.
    submit(&store, |t| {
        t.write(C, "victim", 0, block(2));
    })
    .unwrap();
    assert_eq!(block_on(store.read(C, "victim", 0, 0)).unwrap(), block(2));
}

/// The cleaner moves a block that fails its checksum as it is. Kept in the block cache, it
/// would be served without a check: a read would return the damaged bytes as data, and a
/// partial overwrite would merge them and store them under a fresh, valid checksum.
#[test]
fn a_damaged_block_the_cleaner_moved_still_reads_as_corrupt_and_is_never_merged() {
    let dev = formatted(8 << 20, 256 << 10);
    let config = NativeConfig {
        cache_bytes: 4 << 20,
        checkpoint_interval_blocks: 64,
        ..NativeConfig::default()
    };
    let store = mount(&dev, config);
    let filler = |v: u8| Bytes::from(vec![v; 60 * BLOCK]);
    submit(&store, |t| {
        t.create_collection(C)
            .write(C, "victim", 0, block(0xab))
            .write(C, "filler", 0, filler(1));
    })
    .unwrap();
    // Live data near the store's capacity, so that writers must clean to go on.
    for i in 0..20 {
        submit(&store, |t| {
            t.write(C, "ballast", i * 60 * BLOCK as u64, filler(0xba));
        })
        .unwrap();
    }
    block_on(store.close()).unwrap();
    drop(store);
    let at = dev
        .image()
        .chunks(BLOCK)
        .position(|b| b.iter().all(|&x| x == 0xab))
        .expect("the victim's block on the device");
    dev.flip_bit((at * BLOCK + 100) as u64, 0);
    // Overwriting the filler empties the victim's segment, which the cleaner then takes.
    let store = mount(&dev, config);
    let mut writes = 0;
    while store.stats().checksum_errors == 0 {
        writes += 1;
        assert!(
            writes < 500,
            "the cleaner never moved the victim's block: {:?}",
            store.stats()
        );
        submit(&store, |t| {
            t.write(C, "filler", 0, filler(writes as u8));
        })
        .unwrap();
    }
    assert!(store.stats().blocks_relocated > 0);
    let reads_corrupt = || match block_on(store.read(C, "victim", 0, 0)) {
        Err(e) => e.kind == StoreErrorKind::Corrupt,
        Ok(b) => panic!("the damaged block read as data ({} bytes)", b.len()),
    };
    assert!(reads_corrupt());
    let partial = submit(&store, |t| {
        t.write(C, "victim", 10, Bytes::from_static(b"new bytes"));
    });
    assert_eq!(partial, Err(StoreErrorKind::Corrupt));
    assert!(reads_corrupt());
    // A whole-block overwrite needs nothing of the damaged block, and heals it.
    submit(&store, |t| {
        t.write(C, "victim", 0, block(2));
    })
    .unwrap();
    assert_eq!(block_on(store.read(C, "victim", 0, 0)).unwrap(), block(2));
}

#[test]
fn random_overwrites_at_ninety_percent_fill_keep_working_across_remounts() {
    // 24 segments of 256 KiB: the cleaner must run many times over.
    let dev = formatted(7 << 20, 256 << 10);
    let config = NativeConfig {
        cache_bytes: 256 << 10,
        ..NativeConfig::default()
    };
    let store = mount(&dev, config);
    submit(&store, |t| {
        t.create_collection(C);
    })
    .unwrap();
    let capacity = store.statfs().bytes_total / BLOCK as u64;
    let blocks = capacity * 9 / 10;
    let mut model = vec![0u8; blocks as usize];
    for l in 0..blocks {
        submit(&store, |t| {
            t.write(C, "vol", l * BLOCK as u64, block(1));
        })
        .unwrap();
        model[l as usize] = 1;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut store = store;
    let rounds = 4;
    let (mut cleaned, mut relocated, mut device, mut user) = (0, 0, 0, 0);
    for round in 0..rounds {
        for _ in 0..blocks * 3 {
            let l = rng.random_range(0..blocks);
            let v = rng.random_range(1..=255u8);
            submit(&store, |t| {
                t.write(C, "vol", l * BLOCK as u64, block(v));
            })
            .unwrap_or_else(|e| panic!("overwrite failed at 90% fill: {e:?}"));
            model[l as usize] = v;
        }
        let s = store.stats();
        cleaned += s.segments_cleaned;
        relocated += s.blocks_relocated;
        device += s.device_bytes_written;
        user += s.user_bytes_written;
        if round % 2 == 1 {
            // A clean remount, then a crash-style remount without close.
            block_on(store.close()).unwrap();
        }
        drop(store);
        store = mount(&dev, config);
        let data = block_on(store.read(C, "vol", 0, 0)).unwrap();
        for (l, v) in model.iter().enumerate() {
            assert!(
                data[l * BLOCK..(l + 1) * BLOCK].iter().all(|x| x == v),
                "block {l} lost its last write in round {round}"
            );
        }
    }
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let (free, total) = store.segments_free();
    eprintln!(
        "90% fill: {cleaned} segments cleaned, {relocated} blocks relocated, journal write \
         amplification {:.2}, {free}/{total} segments free",
        device as f64 / user as f64
    );
    assert!(cleaned > 20 && relocated > 0, "the cleaner did not run");
}

/// The cleaner reads its victims' record headers and metadata and then only their live
/// blocks: with large records mostly overwritten, far fewer blocks than its victims hold.
/// Run with the background task (the cleaner reads live data without the apply lock) and
/// without it (the writer cleans, holding the lock).
#[test]
fn the_cleaner_reads_headers_and_live_blocks_not_whole_segments() {
    for background in [false, true] {
        cleaner_reads_little(background, NativeConfig::default());
    }
}

/// The background cleaner pauses after each pass, while clients write, so that what it read
/// and wrote keeps to its rate; unpaced with a rate of 0. (The simulated device only counts
/// the pauses: at 1 MiB/s they add up to far more than the test's own time.)
#[test]
fn the_background_cleaner_keeps_to_its_rate_while_clients_write() {
    let rate = 1 << 20;
    let started = std::time::Instant::now();
    let (s, paused, idle) = cleaner_reads_little(
        true,
        NativeConfig {
            cleaner_busy_rate_bytes: rate,
            ..NativeConfig::default()
        },
    );
    // Each paced pass pauses its cost over the rate, less the time it took, unless a
    // checkpoint falls due meanwhile (writes go on during a pause).
    let due = (s.cleaner_paced_blocks * BLOCK as u64) as f64 / rate as f64;
    eprintln!(
        "paused {paused:?} for {due:.1} s due; idle: paused {:?} more, {} cleaned",
        idle.0, idle.1
    );
    assert!(s.cleaner_paced_blocks > 0, "{s:?}");
    assert!(
        paused.as_secs_f64() <= due,
        "paused {paused:?}, {due} s due"
    );
    assert!(
        paused.as_secs_f64() >= due / 2.0 - started.elapsed().as_secs_f64(),
        "paused {paused:?}, {due} s due"
    );
    assert_eq!(s.cleaner_paused_ns, paused.as_nanos() as u64);
    assert!(
        idle.1 > 0,
        "the background cleaned nothing while clients were idle"
    );
    assert_eq!(
        idle.0,
        std::time::Duration::ZERO,
        "paced while clients were idle"
    );
    let (s, paused, _) = cleaner_reads_little(
        true,
        NativeConfig {
            cleaner_busy_rate_bytes: 0,
            ..NativeConfig::default()
        },
    );
    assert_eq!(paused, std::time::Duration::ZERO);
    assert_eq!(s.cleaner_paused_ns, 0);
}

/// Random overwrites of 32-block extents over 60% of a small store, with the cleaner in the
/// background or in the writers' path; checks the data, a remount and fsck. Returns the
/// store's counters and the pauses its device was asked for.
fn cleaner_reads_little(
    background: bool,
    config: NativeConfig,
) -> (
    carmine_nativestore::NativeStats,
    std::time::Duration,
    (std::time::Duration, u64),
) {
    // 28 segments of 1 MiB; writes of 32 blocks, so records are 33 blocks or more.
    const EXTENT: u64 = 32;
    let segment_blocks = (1u64 << 20) / BLOCK as u64;
    let dev = formatted(28 << 20, 1 << 20);
    let store = mount(&dev, config);
    submit(&store, |t| {
        t.create_collection(C);
    })
    .unwrap();
    let capacity = store.statfs().bytes_total / BLOCK as u64;
    let extents = capacity * 6 / 10 / EXTENT;
    let mut model = vec![0u8; extents as usize];
    let write = |l: u64, v: u8| {
        let mut t = Transaction::new();
        t.write(
            C,
            "vol",
            l * EXTENT * BLOCK as u64,
            Bytes::from(vec![v; EXTENT as usize * BLOCK]),
        );
        store.submit(t)
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let read_before = dev.bytes_read();
    let mut idle = (std::time::Duration::ZERO, 0);
    let work = async {
        for l in 0..extents {
            write(l, 1).await.unwrap();
            model[l as usize] = 1;
        }
        for _ in 0..extents * 6 {
            let l = rng.random_range(0..extents);
            let v = rng.random_range(1..=255u8);
            write(l, v).await.unwrap();
            model[l as usize] = v;
        }
        // Then no client I/O for a while: what the background cleans now is never paced.
        let before = (dev.paused(), store.stats().segments_cleaned_background);
        for _ in 0..1_000 {
            carmine_nativestore::yield_once().await;
        }
        let after = (dev.paused(), store.stats().segments_cleaned_background);
        idle = (after.0 - before.0, after.1 - before.1);
    };
    block_on(async {
        if background {
            let background = std::pin::pin!(store.background());
            let work = std::pin::pin!(work);
            match futures::future::select(background, work).await {
                futures::future::Either::Right(((), _)) => {}
                futures::future::Either::Left(_) => panic!("the shard failed"),
            }
        } else {
            work.await
        }
    });
    let s = store.stats();
    // Whole, aligned extents: the writes read nothing, so what the device served was the
    // cleaner's (and a body read back now and then).
    let read = (dev.bytes_read() - read_before) / BLOCK as u64;
    let data = block_on(store.read(C, "vol", 0, 0)).unwrap();
    for (l, v) in model.iter().enumerate() {
        let at = l * EXTENT as usize * BLOCK;
        assert!(
            data[at..at + EXTENT as usize * BLOCK]
                .iter()
                .all(|x| x == v),
            "extent {l} lost its last write"
        );
    }
    assert!(s.segments_cleaned > 10 && s.blocks_relocated > 0, "{s:?}");
    assert_eq!(s.segments_kept, 0, "{s:?}");
    // Reading whole victims would be a segment per victim with live blocks.
    eprintln!(
        "background {background}: {} segments cleaned, {} blocks relocated, {} blocks read \
         by the cleaner, {read} from the device",
        s.segments_cleaned, s.blocks_relocated, s.cleaner_read_blocks
    );
    assert!(
        read * 2 < s.segments_cleaned * segment_blocks,
        "{read} blocks read for {} victims of {segment_blocks} blocks",
        s.segments_cleaned
    );
    assert!(s.cleaner_read_blocks <= read, "the cleaner's count is off");
    drop(store);
    let store = mount(&dev, config);
    let again = block_on(store.read(C, "vol", 0, 0)).unwrap();
    assert!(again == data, "a remount reads something else");
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    (s, dev.paused(), idle)
}

#[test]
fn a_full_store_says_no_space_and_keeps_serving_reads_and_deletes() {
    let dev = formatted(7 << 20, 256 << 10);
    let store = mount(&dev, NativeConfig::default());
    submit(&store, |t| {
        t.create_collection(C);
    })
    .unwrap();
    let mut n = 0u64;
    let chunk = Bytes::from(vec![5u8; 16 * BLOCK]);
    loop {
        match submit(&store, |t| {
            t.write(C, &format!("o{n}"), 0, chunk.clone());
        }) {
            Ok(()) => n += 1,
            Err(StoreErrorKind::NoSpace) => break,
            Err(e) => panic!("{e:?}"),
        }
        assert!(n < 10_000, "never filled");
    }
    assert!(n > 10);
    let used = store.statfs().bytes_used;
    assert!(used <= store.statfs().bytes_total);
    assert_eq!(block_on(store.read(C, "o0", 0, 0)).unwrap(), chunk);
    // Full, it still mounts, again and again, without rewriting its data: a mount cleans
    // back to its reserve only as far as cleaning frees anything.
    let mut store = store;
    for _ in 0..3 {
        drop(store);
        store = mount(&dev, NativeConfig::default());
        let written = store.stats().device_bytes_written;
        assert!(
            written <= 4 * (256 << 10),
            "a mount of the full store wrote {written} bytes"
        );
        assert_eq!(block_on(store.read(C, "o0", 0, 0)).unwrap(), chunk);
    }
    for i in 0..n / 2 {
        submit(&store, |t| {
            t.remove(C, &format!("o{i}"));
        })
        .unwrap();
    }
    // The freed space is usable again (the cleaner reclaims the dead blocks).
    for i in 0..n / 3 {
        submit(&store, |t| {
            t.write(C, &format!("again{i}"), 0, chunk.clone());
        })
        .unwrap_or_else(|e| panic!("write {i} after deletes: {e:?}"));
    }
    drop(store);
    let store = mount(&dev, NativeConfig::default());
    assert_eq!(
        block_on(store.read(C, &format!("o{}", n - 1), 0, 0)).unwrap(),
        chunk
    );
    assert_eq!(block_on(store.read(C, "again0", 0, 0)).unwrap(), chunk);
}

#[test]
fn concurrent_transactions_share_journal_writes() {
    let dev = formatted(16 << 20, 1 << 20);
    let store = mount(&dev, NativeConfig::default());
    submit(&store, |t| {
        t.create_collection(C);
    })
    .unwrap();
    let before = store.stats();
    let txns: Vec<_> = (0..64u64)
        .map(|i| {
            let mut t = Transaction::new();
            t.write(C, "o", i * BLOCK as u64, block(i as u8));
            store.submit(t)
        })
        .collect();
    for r in block_on(futures::future::join_all(txns)) {
        r.unwrap();
    }
    let after = store.stats();
    let records = after.records - before.records;
    assert!(records <= 3, "64 concurrent writes took {records} records");
    assert_eq!(
        after.user_bytes_written - before.user_bytes_written,
        64 * BLOCK as u64
    );
}

#[test]
fn a_large_write_is_one_extent_in_the_journal_and_reads_back_across_remounts() {
    let dev = formatted(32 << 20, 1 << 20);
    let store = mount(&dev, NativeConfig::default());
    submit(&store, |t| {
        t.create_collection(C);
    })
    .unwrap();
    let before = store.stats().journal_meta_bytes;
    // 64 KiB from byte 2048: 17 blocks, both edges partial.
    let data = Bytes::from(
        (0..16 * BLOCK)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    submit(&store, |t| {
        t.write(C, "o", 2048, data.clone());
    })
    .unwrap();
    let meta = store.stats().journal_meta_bytes - before;
    // Touch, set size and one set extent of 17 blocks (≈ 130 bytes); a delta per block
    // would take over 560.
    assert!(meta < 200, "{meta} metadata bytes for one 64 KiB write");
    let mut model = vec![0u8; 2048];
    model.extend_from_slice(&data);
    // Overwrites cut the extent: one block in the middle, a partial one at the end.
    submit(&store, |t| {
        t.write(C, "o", 5 * BLOCK as u64, block(0xee));
        t.write(C, "o", 16 * BLOCK as u64 + 100, Bytes::from_static(b"tail"));
    })
    .unwrap();
    model[5 * BLOCK..6 * BLOCK].fill(0xee);
    model[16 * BLOCK + 100..16 * BLOCK + 104].copy_from_slice(b"tail");
    let check = |store: &NativeStore<SimDevice>| {
        assert_eq!(block_on(store.read(C, "o", 0, 0)).unwrap(), model[..]);
        // Partial reads across extent edges.
        for (off, len) in [(4000u64, 9000u64), (5 * 4096 - 1, 2), (65000, 2584)] {
            let got = block_on(store.read(C, "o", off, len)).unwrap();
            assert_eq!(
                got,
                model[off as usize..(off + len) as usize],
                "{off}+{len}"
            );
        }
    };
    check(&store);
    drop(store);
    let store = mount(&dev, NativeConfig::default());
    check(&store);
    block_on(store.close()).unwrap();
    drop(store);
    check(&mount(&dev, NativeConfig::default()));
}

#[test]
fn extents_of_every_length_survive_cleaning_at_high_fill_and_remounts() {
    // 24 segments of 256 KiB, filled to ~85% by one object written in runs of 1 to 24
    // blocks, unaligned at times: extents are cut, joined and moved by the cleaner.
    let dev = formatted(7 << 20, 256 << 10);
    let config = NativeConfig {
        cache_bytes: 128 << 10,
        ..NativeConfig::default()
    };
    let mut store = mount(&dev, config);
    submit(&store, |t| {
        t.create_collection(C);
    })
    .unwrap();
    let capacity = store.statfs().bytes_total;
    let size = (capacity * 85 / 100) as usize / BLOCK * BLOCK;
    let mut model = vec![0u8; size];
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut relocated = 0;
    for round in 0..3 {
        for _ in 0..1500 {
            let len = rng.random_range(1..=24) * BLOCK - rng.random_range(0..2) * 100;
            let off = rng.random_range(0..size - len);
            let v = rng.random_range(1..=255u8);
            submit(&store, |t| {
                t.write(C, "vol", off as u64, Bytes::from(vec![v; len]));
            })
            .unwrap_or_else(|e| panic!("write failed at high fill: {e:?}"));
            model[off..off + len].fill(v);
        }
        relocated += store.stats().blocks_relocated;
        if round == 1 {
            block_on(store.close()).unwrap();
        }
        drop(store);
        store = mount(&dev, config);
        let got = block_on(store.read(C, "vol", 0, 0)).unwrap();
        let first_bad = got.iter().zip(&model).position(|(a, b)| a != b);
        assert_eq!(first_bad, None, "round {round}: wrong byte");
    }
    assert!(relocated > 0, "the cleaner moved nothing");
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

#[test]
fn metadata_alone_fills_the_store_to_a_clear_no_space_never_a_failed_shard() {
    // 24 segments of 256 KiB; omap values and xattrs only, no data block: the checkpoint
    // grows with every transaction, and must always still fit.
    let dev = formatted(7 << 20, 256 << 10);
    let store = mount(&dev, NativeConfig::default());
    submit(&store, |t| {
        t.create_collection(C);
    })
    .unwrap();
    let value = Bytes::from(vec![0x5a; 2000]);
    let mut stored = 0u64;
    let full = loop {
        assert!(stored < 100_000, "metadata never filled the store");
        let oid = format!("obj-{}", stored / 16);
        let key = Bytes::from(format!("key-{stored}"));
        let r = submit(&store, |t| {
            t.omap_set(C, &oid, vec![(key, value.clone())]);
        });
        match r {
            Ok(()) => stored += 1,
            Err(kind) => break kind,
        }
    };
    assert_eq!(full, StoreErrorKind::NoSpace);
    assert_eq!(
        store.failure(),
        None,
        "the shard failed instead of refusing"
    );
    let used = store.statfs().bytes_used;
    assert!(
        used >= stored * 2000,
        "statfs counts {used} bytes used for {stored} values of 2000 bytes"
    );
    // Reads go on; deletes free room and writes go on.
    let got = block_on(store.omap_get_values(C, "obj-0", &[Bytes::from("key-0")])).unwrap();
    assert_eq!(got.len(), 1);
    for i in 0..stored / 16 / 2 {
        submit(&store, |t| {
            t.remove(C, &format!("obj-{i}"));
        })
        .unwrap();
    }
    submit(&store, |t| {
        t.write(C, "after", 0, block(7));
    })
    .unwrap();
    drop(store);
    let store = mount(&dev, NativeConfig::default());
    assert_eq!(block_on(store.read(C, "after", 0, 0)).unwrap(), block(7));
    let last = format!("obj-{}", (stored - 1) / 16);
    let key = Bytes::from(format!("key-{}", stored - 1));
    let got = block_on(store.omap_get_values(C, &last, std::slice::from_ref(&key))).unwrap();
    assert_eq!(got.get(&key), Some(&value));
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

/// A device formatted over an old store keeps the old segments' headers and records until
/// the cleaner reuses them: mount takes them for another store's, never for records of its
/// own journal whose segment header was damaged.
#[test]
fn a_store_formatted_over_an_old_one_mounts_empty() {
    const SEGMENT: u32 = 1 << 20;
    let dev = formatted(16 << 20, SEGMENT);
    let config = NativeConfig {
        checkpoint_interval_blocks: 1 << 30,
        ..NativeConfig::default()
    };
    let store = mount(&dev, config);
    let pg = PgId { pool: 1, seed: 0 };
    submit(&store, |t| {
        t.create_collection(pg);
    })
    .unwrap();
    // About three segments of journal.
    for i in 0..700u32 {
        submit(&store, |t| {
            t.write(
                pg,
                &format!("o{}", i % 50),
                u64::from(i / 50) * BLOCK as u64,
                block(i as u8),
            );
        })
        .unwrap();
    }
    drop(store);
    block_on(mkfs(&dev, 1, SEGMENT)).unwrap();
    let store = mount(&dev, config);
    assert_eq!(store.statfs().objects, 0);
}
