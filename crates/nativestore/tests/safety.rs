//! Data safety (issue #10): superblock copies, damage in the journal, and commits that do not
//! depend on any one caller's future running to the end.

use bytes::Bytes;
use carmine_nativestore::{
    fsck, mkfs, read_superblock_copies, upgrade, AlignedBuf, BlockDevice, FormatError, MountError,
    NativeConfig, NativeStore, SimDevice, BLOCK, FORMAT_VERSION, SUPER_BACKUP_OFFSET,
};
use carmine_store::{ObjectStore, StoreErrorKind, Transaction};
use carmine_types::{CollectionId, PgId};
use futures::executor::block_on;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

const C: CollectionId = PgId { pool: 1, seed: 0 };

fn formatted() -> SimDevice {
    let dev = SimDevice::new(16 << 20);
    block_on(mkfs(&dev, 1, 1 << 20)).unwrap();
    dev
}

fn mount(dev: &SimDevice) -> NativeStore<SimDevice> {
    block_on(NativeStore::mount(dev.clone(), 0, NativeConfig::default())).unwrap()
}

fn pattern(byte: u8) -> Bytes {
    Bytes::from(vec![byte; BLOCK])
}

fn write_txn(oid: &str, byte: u8) -> Transaction {
    let mut t = Transaction::new();
    t.write(C, oid, 0, pattern(byte));
    t
}

/// Polls `f` until it is ready, at most `polls` times (the simulated device completes on the
/// next poll, so a healthy store needs a handful); `None` means it never completed.
fn poll_bounded<F: Future>(f: F, polls: usize) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    for _ in 0..polls {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
    }
    None
}

fn poll_once<F: Future>(f: &mut Pin<Box<F>>) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    f.as_mut().poll(&mut Context::from_waker(&waker))
}

/// Byte offset of the only block holding `byte` repeated.
fn find_block(dev: &SimDevice, byte: u8) -> u64 {
    let image = dev.image();
    let hits: Vec<u64> = image
        .chunks_exact(BLOCK)
        .enumerate()
        .filter(|(_, b)| b.iter().all(|x| *x == byte))
        .map(|(i, _)| (i * BLOCK) as u64)
        .collect();
    assert_eq!(hits.len(), 1, "pattern {byte:#x} found at {hits:?}");
    hits[0]
}

/// Four acknowledged transactions, each in its own journal record, then a crash (no close,
/// so mount must replay them).
fn four_records() -> SimDevice {
    let dev = formatted();
    let store = mount(&dev);
    let mut t = Transaction::new();
    t.create_collection(C);
    block_on(store.submit(t)).unwrap();
    for (oid, byte) in [("a", 0xa1), ("b", 0xb2), ("c", 0xc3), ("d", 0xd4)] {
        block_on(store.submit(write_txn(oid, byte))).unwrap();
    }
    drop(store);
    dev
}

#[test]
fn mount_uses_the_backup_superblock_when_the_primary_is_damaged() {
    let dev = four_records();
    dev.flip_bit(20, 3);
    let copies = block_on(read_superblock_copies(&dev)).unwrap();
    assert!(copies.primary_damaged.is_some());
    let store = mount(&dev);
    assert_eq!(block_on(store.read(C, "d", 0, 0)).unwrap(), pattern(0xd4));
}

#[test]
fn mount_refuses_when_both_superblocks_are_damaged_and_writes_nothing() {
    let dev = four_records();
    dev.flip_bit(20, 3);
    dev.flip_bit(SUPER_BACKUP_OFFSET + 20, 3);
    let before = dev.image();
    let err = block_on(NativeStore::mount(dev.clone(), 0, NativeConfig::default()))
        .err()
        .expect("mounted without a superblock");
    assert!(matches!(err, MountError::SuperblockDamaged { .. }), "{err}");
    assert!(
        err.to_string().contains("refusing to touch the device"),
        "{err}"
    );
    assert!(before == dev.image(), "a refused mount changed the device");
}

#[test]
fn a_superblock_of_a_newer_version_is_refused_not_bypassed_through_the_backup() {
    let dev = four_records();
    let mut block = dev.image()[..BLOCK].to_vec();
    // Re-seal the primary with a future version: a valid superblock this build cannot read.
    block[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let shards = u32::from_le_bytes(block[36..40].try_into().unwrap()) as usize;
    let body = 40 + shards * 12;
    let crc = carmine_types::crc32c(&block[..body]);
    block[body..body + 4].copy_from_slice(&crc.to_le_bytes());
    let image = dev.image();
    for (i, b) in block.iter().enumerate() {
        for bit in 0..8 {
            if (b ^ image[i]) & (1 << bit) != 0 {
                dev.flip_bit(i as u64, bit);
            }
        }
    }
    let err = block_on(NativeStore::mount(dev.clone(), 0, NativeConfig::default()))
        .err()
        .expect("mounted a newer format");
    assert!(
        matches!(err, MountError::NewerFormat(FormatError::Version { found }) if found == FORMAT_VERSION + 1),
        "{err}"
    );
    assert!(
        err.to_string().contains("unsupported format version"),
        "{err}"
    );
}

#[test]
fn replay_refuses_to_drop_acknowledged_records_after_a_damaged_one() {
    let dev = four_records();
    // Record "b": its header block sits just before its data block. Damage its metadata.
    let header = find_block(&dev, 0xb2) - BLOCK as u64;
    dev.flip_bit(header + 100, 0);
    let err = block_on(NativeStore::mount(dev.clone(), 0, NativeConfig::default()))
        .err()
        .expect("mount silently dropped acknowledged records");
    assert!(
        matches!(
            err,
            MountError::AcknowledgedRecordLost {
                record: 3,
                durable_mark: 4
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("refusing"), "{err}");
    let err = block_on(fsck(dev, 0)).expect_err("fsck called it clean");
    assert!(err.to_string().contains("were acknowledged"), "{err}");
}

#[test]
fn a_damaged_data_block_of_an_acknowledged_record_costs_that_block_only() {
    let dev = four_records();
    dev.flip_bit(find_block(&dev, 0xb2) + 7, 1);
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert_eq!(report.mount.damaged_blocks, 1);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    let store = mount(&dev);
    let err = block_on(store.read(C, "b", 0, 0)).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    for (oid, byte) in [("a", 0xa1), ("c", 0xc3), ("d", 0xd4)] {
        assert_eq!(block_on(store.read(C, oid, 0, 0)).unwrap(), pattern(byte));
    }
}

/// The last record's data damaged: no later record says it was acknowledged, so it reads as
/// the torn tail of a crash and the journal ends before it; damage in an earlier record that
/// a later one vouches for costs that block only. The replay reads one segment at a time and
/// decides this only once it has seen every record's durable mark.
#[test]
fn damaged_data_ends_the_journal_only_where_no_later_record_vouches_for_it() {
    let clean = four_records();
    let whole = block_on(NativeStore::mount_reporting(
        clean.clone(),
        0,
        NativeConfig::default(),
    ))
    .unwrap()
    .1
    .records_replayed;
    for damage_c in [false, true] {
        let dev = four_records();
        dev.flip_bit(find_block(&dev, 0xd4) + 7, 1);
        if damage_c {
            dev.flip_bit(find_block(&dev, 0xc3) + 9, 2);
        }
        let (store, report) = block_on(NativeStore::mount_reporting(
            dev.clone(),
            0,
            NativeConfig::default(),
        ))
        .unwrap();
        assert_eq!(report.records_replayed, whole - 1, "{report:?}");
        assert_eq!(report.damaged_blocks, u64::from(damage_c), "{report:?}");
        let d = block_on(store.read(C, "d", 0, 0)).unwrap_err();
        assert_eq!(d.kind, StoreErrorKind::ObjectNotFound, "{d}");
        match damage_c {
            true => assert_eq!(
                block_on(store.read(C, "c", 0, 0)).unwrap_err().kind,
                StoreErrorKind::Corrupt
            ),
            false => assert_eq!(block_on(store.read(C, "c", 0, 0)).unwrap(), pattern(0xc3)),
        }
        for (oid, byte) in [("a", 0xa1), ("b", 0xb2)] {
            assert_eq!(block_on(store.read(C, oid, 0, 0)).unwrap(), pattern(byte));
        }
    }
}

#[test]
fn a_commit_dropped_mid_write_hands_its_batch_to_the_next_writer() {
    let dev = formatted();
    let store = mount(&dev);
    let mut t = Transaction::new();
    t.create_collection(C);
    block_on(store.submit(t)).unwrap();
    // The first submitter becomes the journal writer and is cancelled mid-write.
    let mut first = Box::pin(store.submit(write_txn("a", 0xa1)));
    assert!(poll_once(&mut first).is_pending());
    drop(first);
    let done = poll_bounded(store.submit(write_txn("b", 0xb2)), 1000);
    assert_eq!(
        done,
        Some(Ok(())),
        "the shard is wedged after a dropped commit"
    );
    drop(store);
    // "b" was acknowledged after "a" entered the journal: "a" must be there too.
    let store = mount(&dev);
    assert_eq!(block_on(store.read(C, "a", 0, 0)).unwrap(), pattern(0xa1));
    assert_eq!(block_on(store.read(C, "b", 0, 0)).unwrap(), pattern(0xb2));
}

#[test]
fn a_caller_that_stops_polling_does_not_stall_other_writers() {
    let dev = formatted();
    let store = mount(&dev);
    let mut t = Transaction::new();
    t.create_collection(C);
    block_on(store.submit(t)).unwrap();
    let outcome = block_on(async {
        let background = std::pin::pin!(store.background());
        let work = std::pin::pin!(async {
            // Polled once, then never again (its connection is stuck writing replies).
            let mut stuck = Box::pin(store.submit(write_txn("a", 0xa1)));
            assert!(poll_once(&mut stuck).is_pending());
            let r = store.submit(write_txn("b", 0xb2)).await;
            (r, stuck)
        });
        // The shard's task first, as the OSD starts it before it serves anyone.
        match poll_bounded(futures::future::select(background, work), 1000) {
            Some(futures::future::Either::Right(((r, _stuck), _))) => Some(r),
            _ => None,
        }
    });
    assert_eq!(
        outcome,
        Some(Ok(())),
        "a stalled caller blocked another writer"
    );
}

/// Bytes a format 4 slot listing `n` blob segments checksums (it ends with the tree root).
fn slot_body_len(n: usize) -> usize {
    8 + 4 + 4 + 4 + 16 + 8 + 4 + 8 + 4 + 8 + 8 + 8 + 4 + 4 * n + 8
}

/// Rewrites the checkpoint slot at byte `at` with `edit` (given the slot and the length of
/// its checksummed body) and a fresh CRC, flipping only the bits that change.
fn craft_slot(dev: &SimDevice, at: u64, edit: impl FnOnce(&mut [u8], usize)) {
    let image = dev.image();
    let mut slot = image[at as usize..at as usize + BLOCK].to_vec();
    let n = u32::from_le_bytes(slot[12..16].try_into().unwrap()) as usize;
    let body = slot_body_len(n);
    edit(&mut slot, body);
    let crc = carmine_types::crc32c(&slot[..body]);
    slot[body..body + 4].copy_from_slice(&crc.to_le_bytes());
    for (i, b) in slot.iter().enumerate() {
        for bit in 0..8 {
            if (b ^ image[at as usize + i]) & (1 << bit) != 0 {
                dev.flip_bit(at + i as u64, bit);
            }
        }
    }
}

#[test]
fn a_crafted_checkpoint_slot_is_an_error_not_a_crash() {
    let dev = formatted();
    // mkfs's slot (generation 1, shard block 1 at 1 MiB + 4 KiB) names a blob: claim an
    // absurd length for it.
    craft_slot(&dev, (1 << 20) + BLOCK as u64, |slot, body| {
        let n = u32::from_le_bytes(slot[12..16].try_into().unwrap()) as usize;
        let blob_len_at = body - 8 - 4 * n - 4 - 8;
        slot[blob_len_at..blob_len_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    });
    let err = block_on(NativeStore::mount(dev, 0, NativeConfig::default()))
        .err()
        .expect("mounted a crafted slot");
    assert!(
        matches!(&err, MountError::Checkpoint { detail, .. } if detail.contains("claims")),
        "{err}"
    );
    // A tree root outside the shard's segments (the slot of generation 2, written by the
    // first mount, in shard block 0).
    let dev = formatted();
    drop(mount(&dev));
    craft_slot(&dev, 1 << 20, |slot, body| {
        slot[body - 8..body].copy_from_slice(&1u64.to_le_bytes());
    });
    let err = block_on(NativeStore::mount(dev, 0, NativeConfig::default()))
        .err()
        .expect("mounted a crafted tree root");
    assert!(
        matches!(&err, MountError::Checkpoint { detail, .. } if detail.contains("outside every segment")),
        "{err}"
    );
}

#[test]
fn a_damaged_metadata_node_refuses_the_mount_and_writes_nothing() {
    let dev = formatted();
    {
        let store = mount(&dev);
        let mut t = Transaction::new();
        t.create_collection(C);
        t.write(C, "a", 0, Bytes::from(vec![7u8; 8192]));
        block_on(store.submit(t)).unwrap();
        block_on(store.close()).unwrap();
    }
    // The newest slot names the tree's root; flip a bit in the root node.
    let image = dev.image();
    let slot = |i: usize| {
        let at = (1 << 20) + i * BLOCK;
        let b = &image[at..at + BLOCK];
        let generation = u64::from_le_bytes(b[36..44].try_into().unwrap());
        let body = slot_body_len(0);
        let root = u64::from_le_bytes(b[body - 8..body].try_into().unwrap());
        (generation, root)
    };
    let (_, root) = slot(0).max(slot(1));
    let root_at = (1 << 20) + root * BLOCK as u64;
    dev.flip_bit(root_at + 100, 3);
    let before = dev.image();
    let err = block_on(NativeStore::mount(dev.clone(), 0, NativeConfig::default()))
        .err()
        .expect("mounted a damaged metadata node");
    assert!(
        matches!(&err, MountError::Checkpoint { detail, .. } if detail.contains("checksum")),
        "{err}"
    );
    assert!(dev.image() == before, "a refused mount wrote to the device");
}

/// Rewrites the superblock copy at `at` as format `version` (everything else as it is).
fn set_superblock_version(dev: &SimDevice, at: u64, version: u32) {
    let mut sb = block_on(read_superblock_copies(dev)).unwrap().superblock;
    sb.version = version;
    let mut buf = AlignedBuf::new(BLOCK);
    buf.extend_from_slice(&sb.encode());
    buf.pad_to_block();
    block_on(dev.write_at(buf, at)).0.unwrap();
}

#[test]
fn an_older_format_is_read_but_written_only_after_an_upgrade() {
    let dev = four_records();
    let big = Bytes::from((0..16 * BLOCK).map(|i| (i / 7) as u8).collect::<Vec<u8>>());
    let store = mount(&dev);
    let mut t = Transaction::new();
    t.write(C, "big", 0, big.clone());
    block_on(store.submit(t)).unwrap();
    drop(store);
    for at in [0, SUPER_BACKUP_OFFSET] {
        set_superblock_version(&dev, at, FORMAT_VERSION - 1);
    }
    let before = dev.image();
    let refused = |dev: &SimDevice| {
        let err = block_on(NativeStore::mount(dev.clone(), 0, NativeConfig::default()))
            .err()
            .expect("mounted an older format for writing");
        assert!(
            matches!(err, MountError::OlderFormat { found } if found == FORMAT_VERSION - 1),
            "{err}"
        );
        assert!(err.to_string().contains("carmine store upgrade"), "{err}");
    };
    refused(&dev);
    assert!(before == dev.image(), "a refused mount changed the device");
    // Read-only checks still work on the older format.
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.mount.objects, 5);
    // A crash in the middle of an upgrade: the backup is new, the primary still old.
    set_superblock_version(&dev, SUPER_BACKUP_OFFSET, FORMAT_VERSION);
    refused(&dev);
    assert_eq!(block_on(upgrade(&dev)).unwrap(), FORMAT_VERSION - 1);
    let copies = block_on(read_superblock_copies(&dev)).unwrap();
    assert_eq!(copies.superblock.version, FORMAT_VERSION);
    assert!(
        copies.backup_problem.is_none(),
        "{:?}",
        copies.backup_problem
    );
    let store = mount(&dev);
    assert_eq!(block_on(store.read(C, "big", 0, 0)).unwrap(), big);
    assert_eq!(block_on(store.read(C, "c", 0, 0)).unwrap(), pattern(0xc3));
    drop(store);
    assert_eq!(block_on(upgrade(&dev)).unwrap(), FORMAT_VERSION);
}
