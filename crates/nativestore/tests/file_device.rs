//! The real file device (O_DIRECT through io_uring) in each durability mode: durable writes
//! (`write_durable_at`, the O_DSYNC descriptor in the default mode) land where they should,
//! and a store whose small records go out that way reads everything back after a remount.

use bytes::Bytes;
use carmine_nativestore::{
    mkfs, AlignedBuf, BlockDevice, FileDevice, NativeConfig, NativeStore, SyncMode, BLOCK,
};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::PgId;
use std::path::PathBuf;

fn scratch_file(name: &str, size: usize) -> PathBuf {
    // In the target directory: on the project's file system, which takes O_DIRECT (a tmpfs
    // /tmp would not).
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::write(&path, vec![0u8; size]).unwrap();
    path
}

fn block_of(byte: u8) -> AlignedBuf {
    let mut b = AlignedBuf::new(BLOCK);
    b.extend_from_slice(&[byte; BLOCK]);
    b
}

#[test]
fn durable_and_plain_writes_read_back_in_every_mode() {
    for mode in [
        SyncMode::Fdatasync,
        SyncMode::Dsync,
        SyncMode::ProcessCrashOnly,
    ] {
        let path = scratch_file("device", 1 << 20);
        carmine_reactor::block_on(async {
            let dev = FileDevice::open(&path, mode).await.unwrap();
            let (res, _) = dev.write_durable_at(block_of(0xa1), 2 * BLOCK as u64).await;
            res.unwrap();
            let (res, _) = dev.write_at(block_of(0xb2), 5 * BLOCK as u64).await;
            res.unwrap();
            dev.sync().await.unwrap();
            for (at, byte) in [(2, 0xa1u8), (5, 0xb2), (3, 0)] {
                let (res, buf) = dev.read_at(AlignedBuf::new(BLOCK), at * BLOCK as u64).await;
                res.unwrap();
                assert!(
                    buf.full().iter().all(|b| *b == byte),
                    "{mode:?}: block {at} should be {byte:#x}"
                );
            }
            // Out of range or unaligned: an error, not a write somewhere else.
            let (res, _) = dev.write_durable_at(block_of(1), 1 << 20).await;
            assert!(res.is_err(), "{mode:?}: a write past the end");
        });
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_store_of_lone_small_records_reads_back_after_a_remount() {
    let path = scratch_file("store", 64 << 20);
    let cid = PgId { pool: 1, seed: 3 };
    carmine_reactor::block_on(async {
        let dev = FileDevice::open(&path, SyncMode::Fdatasync).await.unwrap();
        mkfs(&dev, 1, 1 << 20).await.unwrap();
        let store = NativeStore::mount(dev, 0, NativeConfig::default())
            .await
            .unwrap();
        let mut t = Transaction::new();
        t.create_collection(cid);
        store.submit(t).await.unwrap();
        // One transaction at a time: each journal write is one small record, made durable
        // by the write itself.
        for i in 0..64u64 {
            let mut t = Transaction::new();
            t.write(
                cid,
                "obj",
                i * BLOCK as u64,
                Bytes::from(vec![i as u8; BLOCK]),
            );
            store.submit(t).await.unwrap();
        }
        drop(store);
        let dev = FileDevice::open(&path, SyncMode::Fdatasync).await.unwrap();
        let store = NativeStore::mount(dev, 0, NativeConfig::default())
            .await
            .unwrap();
        let data = store.read(cid, "obj", 0, 64 * BLOCK as u64).await.unwrap();
        for (i, chunk) in data.chunks(BLOCK).enumerate() {
            assert!(
                chunk.iter().all(|b| *b == i as u8),
                "block {i} after remount"
            );
        }
    });
    std::fs::remove_file(&path).unwrap();
}
