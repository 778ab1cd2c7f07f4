//! What a mount holds in memory (decision 0013, step 3): the object cache's worth of bodies
//! and those the journal replay changes, not every object's extent map, and not every node
//! of the metadata tree. A store the size of a real disk has far more metadata than RAM.

use bytes::Bytes;
use carmine_nativestore::{mkfs, NativeConfig, NativeStore, SimDevice};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::{CollectionId, PgId};
use futures::executor::block_on;

const C: CollectionId = PgId { pool: 2, seed: 5 };

fn name(i: usize) -> String {
    format!("rbd_data.{i:06}")
}

/// Writes one 4 KiB block to each of `objects` at block `round * 7 % blocks`, newest
/// first: no two blocks of an object land next to each other on the device, so every block
/// is an extent of its own, as random writes to a volume leave them.
fn scatter(t: &mut Transaction, objects: std::ops::Range<usize>, round: usize, blocks: usize) {
    for i in objects.rev() {
        let b = (round * 7 + i) % blocks;
        t.write(
            C,
            &name(i),
            (b * 4096) as u64,
            Bytes::from(vec![(i + round) as u8; 4096]),
        );
    }
}

#[test]
fn a_mount_holds_the_object_cache_and_what_replay_changes_not_every_body() {
    let (objects, blocks) = (48, 64);
    let dev = SimDevice::new(64 << 20);
    block_on(mkfs(&dev, 1, 1 << 20)).unwrap();
    let config = NativeConfig {
        object_cache_bytes: 4 << 10,
        metadata_cache_bytes: 16 << 10,
        ..NativeConfig::default()
    };
    let store = block_on(NativeStore::mount(dev.clone(), 0, config)).unwrap();
    let mut t = Transaction::new();
    t.create_collection(C);
    block_on(store.submit(t)).unwrap();
    for round in 0..blocks {
        let mut t = Transaction::new();
        scatter(&mut t, 0..objects, round, blocks);
        block_on(store.submit(t)).unwrap();
    }
    block_on(store.close()).unwrap();
    // After the checkpoint, two objects change in the journal only: replay needs their
    // bodies, whatever the cache.
    let mut t = Transaction::new();
    t.write(C, &name(3), 0, Bytes::from(vec![0xee; 4096]));
    t.write(C, &name(40), 8192, Bytes::from(vec![0xdd; 4096]));
    block_on(store.submit(t)).unwrap();
    block_on(store.flush()).unwrap();
    drop(store);

    // A read-only look first (fsck's default 64 MiB cache holds every body here): what all
    // bodies take, and the same replay.
    let full = block_on(carmine_nativestore::fsck(dev.clone(), 0)).unwrap();
    assert!(full.errors.is_empty(), "{:?}", full.errors);
    assert_eq!(full.mount.bodies_paged_out_at_load, 0);
    let all = full.mount.bodies_loaded_bytes;
    let per_object = all / objects as u64;
    assert!(
        per_object > 64 * 12,
        "a record of 64 extents: {per_object} bytes"
    );

    let (store, report) = block_on(NativeStore::mount_reporting(dev.clone(), 0, config)).unwrap();
    eprintln!("{report:?}; all bodies {all} bytes");
    assert_eq!(report.records_replayed, 1);
    assert_eq!(report.objects, objects as u64);
    assert!(
        report.bodies_loaded_bytes <= config.object_cache_bytes + 2 * (per_object + 64),
        "the load kept {} bytes of bodies for a cache of {} and two replayed objects of \
         about {per_object} each (all of them: {all})",
        report.bodies_loaded_bytes,
        config.object_cache_bytes
    );
    assert!(
        report.bodies_paged_out_at_load
            >= (objects - 2) as u64 - config.object_cache_bytes / per_object,
        "{report:?}"
    );
    // Everything reads back as written, paged-out bodies included.
    for i in 0..objects {
        let got = block_on(store.read(C, &name(i), 0, (blocks * 4096) as u64)).unwrap();
        for b in 0..blocks {
            let want = match (i, b) {
                (3, 0) => 0xee,
                (40, 2) => 0xdd,
                _ => {
                    // The last round that wrote block b of object i.
                    let round = (0..blocks)
                        .rev()
                        .find(|r| (r * 7 + i) % blocks == b)
                        .unwrap();
                    (i + round) as u8
                }
            };
            assert!(
                got[b * 4096..(b + 1) * 4096].iter().all(|x| *x == want),
                "{}: block {b}",
                name(i)
            );
        }
    }
    drop(store);
    // fsck with the same caches reads every paged-out body back through the tree.
    let report = block_on(carmine_nativestore::fsck_with(dev.clone(), 0, config)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.blocks_checked, (objects * blocks) as u64);
    assert!(report.mount.bodies_paged_out_at_load >= objects as u64 - 3);
}

fn status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The measurement behind BENCHMARKS.md: `CARMINE_MOUNT_MEMORY_GIB=4 cargo test --release
/// -p carmine-nativestore --test mount_memory -- --nocapture`. Fills a file-backed store of
/// that many GiB with 4 KiB blocks scattered over 4 MiB objects (an extent each), checkpoints,
/// and reports the process's peak RSS over a mount with 4 MiB object and metadata caches.
#[test]
fn mount_memory_on_a_file() {
    let Some(gib) = std::env::var("CARMINE_MOUNT_MEMORY_GIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    else {
        eprintln!("CARMINE_MOUNT_MEMORY_GIB not set: skipped");
        return;
    };
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("mount-memory-{}", std::process::id()));
    let size = (gib + gib / 2 + 1) << 30;
    std::fs::File::create(&path)
        .unwrap()
        .set_len(size as u64)
        .unwrap();
    let config = NativeConfig {
        object_cache_bytes: 4 << 20,
        metadata_cache_bytes: 4 << 20,
        ..NativeConfig::default()
    };
    let (objects, blocks) = (gib * 256, 1024);
    carmine_reactor::block_on(async {
        let open = || {
            carmine_nativestore::FileDevice::open(
                &path,
                carmine_nativestore::SyncMode::ProcessCrashOnly,
            )
        };
        mkfs(&open().await.unwrap(), 1, 32 << 20).await.unwrap();
        let store = NativeStore::mount(open().await.unwrap(), 0, config)
            .await
            .unwrap();
        let mut t = Transaction::new();
        t.create_collection(C);
        store.submit(t).await.unwrap();
        let started = std::time::Instant::now();
        for round in 0..blocks {
            for chunk in (0..objects).step_by(256) {
                let mut t = Transaction::new();
                scatter(&mut t, chunk..(chunk + 256).min(objects), round, blocks);
                store.submit(t).await.unwrap();
            }
        }
        store.close().await.unwrap();
        eprintln!(
            "filled {objects} objects x {blocks} blocks in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        drop(store);
        unsafe { libc::malloc_trim(0) };
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status("VmRSS:");
        let started = std::time::Instant::now();
        let store = NativeStore::mount(open().await.unwrap(), 0, config)
            .await
            .unwrap();
        let secs = started.elapsed().as_secs_f64();
        let (peak, after) = (status("VmHWM:"), status("VmRSS:"));
        let stats = store.stats();
        eprintln!(
            "mount of {gib} GiB ({objects} objects, {} metadata nodes): {secs:.1} s, RSS \
             {before} KiB before, peak {peak} KiB (+{} MiB), {after} KiB after; bodies \
             resident {} KiB, paged out {}",
            stats.metadata_nodes,
            (peak - before) >> 10,
            stats.body_resident_bytes >> 10,
            stats.bodies_paged_out
        );
        // Two objects of three go: the next checkpoint writes the tree afresh.
        for chunk in (0..objects).collect::<Vec<_>>().chunks(64) {
            let mut t = Transaction::new();
            for i in chunk.iter().filter(|i| *i % 3 != 0) {
                t.remove(C, &name(*i));
            }
            store.submit(t).await.unwrap();
        }
        unsafe { libc::malloc_trim(0) };
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status("VmRSS:");
        let started = std::time::Instant::now();
        store.checkpoint_now().await.unwrap();
        let secs = started.elapsed().as_secs_f64();
        let peak = status("VmHWM:");
        let after = store.stats();
        assert_eq!(after.tree_rewrites, stats.tree_rewrites + 1, "{after:?}");
        eprintln!(
            "checkpoint after removing 2/3 of the objects: {secs:.2} s, tree written afresh \
             {} time(s), {} -> {} metadata nodes, RSS {before} KiB before, peak {peak} KiB \
             (+{} MiB), {} nodes held at most",
            after.tree_rewrites - stats.tree_rewrites,
            stats.metadata_nodes,
            after.metadata_nodes,
            (peak - before) >> 10,
            after.tree_rewrite_nodes_held_max
        );
        // A crash with a long journal since the checkpoint: 64 KiB writes of a quarter of
        // the data (about half the checkpoint interval, a quarter of the shard), durable,
        // then no close. The mount replays them, and checkpoints (counted in the figures).
        let journal_mib = gib << 8;
        for k in 0..journal_mib * 16 {
            let mut t = Transaction::new();
            t.write(
                C,
                &name(k % objects),
                ((k / objects) % 64 * 65536) as u64,
                Bytes::from(vec![k as u8; 65536]),
            );
            store.submit(t).await.unwrap();
        }
        store.flush().await.unwrap();
        drop(store);
        unsafe { libc::malloc_trim(0) };
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status("VmRSS:");
        let started = std::time::Instant::now();
        let (store, report) = NativeStore::mount_reporting(open().await.unwrap(), 0, config)
            .await
            .unwrap();
        let secs = started.elapsed().as_secs_f64();
        let peak = status("VmHWM:");
        assert_eq!(
            report.records_replayed,
            journal_mib as u64 * 16,
            "{report:?}"
        );
        eprintln!(
            "mount replaying {} records ({journal_mib} MiB written since the checkpoint): \
             {secs:.1} s, RSS {before} KiB before, peak {peak} KiB (+{} MiB)",
            report.records_replayed,
            (peak - before) >> 10,
        );
        drop(store);
    });
    std::fs::remove_file(&path).unwrap();
}
