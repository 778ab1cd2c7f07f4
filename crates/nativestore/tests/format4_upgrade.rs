//! A store written by a format 4 build (records that hold their extents) read by this one:
//! refused for writing until `upgrade`, then mounted with its journal replayed, changed, and
//! checkpointed, its records turned into version 2 and extent entries as their objects
//! change, with nothing lost across remounts.
//!
//! The image in `fixtures/format4-store.img.gz` was written by `write_the_fixture` below,
//! run with the build of commit 6156bdb (format 4):
//! `cargo test --release -p carmine-nativestore --test format4_upgrade -- --ignored`.

use bytes::Bytes;
use carmine_nativestore::{
    fsck, mkfs, upgrade, MountError, NativeConfig, NativeStore, SimDevice, BLOCK, FORMAT_VERSION,
};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::{CollectionId, PgId};
use futures::executor::block_on;
use std::io::{Read, Write};

const C: CollectionId = PgId { pool: 1, seed: 0 };
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format4-store.img.gz"
);
/// Blocks of the object written in a scattered order: one extent per block.
const SCATTERED: u64 = 256;
/// Its blocks overwritten after the checkpoint, replayed from the journal by the mount.
const REPLAYED: [u64; 3] = [3, 100, 200];

fn block(byte: u8) -> Bytes {
    Bytes::from(vec![byte; BLOCK])
}

/// The data of the scattered object's block `l` as the fixture left it.
fn scattered_byte(l: u64) -> u8 {
    if REPLAYED.contains(&l) {
        0xee
    } else {
        (l as u8) ^ 0x5a
    }
}

fn submit(store: &NativeStore<SimDevice>, build: impl FnOnce(&mut Transaction)) {
    let mut t = Transaction::new();
    build(&mut t);
    block_on(store.submit(t)).unwrap();
}

fn read(store: &NativeStore<SimDevice>, oid: &str, l: u64, blocks: u64) -> Bytes {
    let len = blocks * BLOCK as u64;
    block_on(store.read(C, oid, l * BLOCK as u64, len)).unwrap()
}

/// What the fixture holds, plus `changed` (block → byte) of the scattered object.
fn check(store: &NativeStore<SimDevice>, changed: &[(u64, u8)]) {
    for l in 0..SCATTERED {
        let byte = changed
            .iter()
            .find(|(at, _)| *at == l)
            .map_or(scattered_byte(l), |(_, b)| *b);
        assert_eq!(
            read(store, "scattered", l, 1),
            block(byte),
            "scattered block {l}"
        );
    }
    let seq: Vec<u8> = (0..16 * BLOCK).map(|i| (i / BLOCK * 7) as u8).collect();
    assert_eq!(read(store, "sequential", 0, 16), Bytes::from(seq));
    assert_eq!(read(store, "meta", 0, 1), block(0x42));
    let attr = block_on(store.getattr(C, "meta", "user.a")).unwrap();
    assert_eq!(attr, Bytes::from_static(b"alpha"));
    let header = block_on(store.omap_get_header(C, "meta")).unwrap();
    assert_eq!(header, Bytes::from_static(b"hdr"));
    assert_eq!(
        read(store, "late", 0, 2),
        Bytes::from(vec![0x77; 2 * BLOCK])
    );
    assert!(
        block_on(store.stat(C, "gone")).is_err(),
        "a removed object is back"
    );
}

fn mount(dev: &SimDevice) -> NativeStore<SimDevice> {
    block_on(NativeStore::mount(dev.clone(), 0, NativeConfig::default())).unwrap()
}

#[test]
fn a_format_4_store_is_upgraded_and_its_records_rewritten_as_they_change() {
    let mut image = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(FIXTURE).unwrap())
        .read_to_end(&mut image)
        .unwrap();
    let dev = SimDevice::from_image(image);
    let err = block_on(NativeStore::mount(dev.clone(), 0, NativeConfig::default()))
        .err()
        .expect("a format 4 store mounted for writing");
    assert!(matches!(err, MountError::OlderFormat { found: 4 }), "{err}");
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(block_on(upgrade(&dev)).unwrap(), 4);
    assert_eq!(FORMAT_VERSION, 5);

    // The mount replays the journal onto records of version 1 and checkpoints: the
    // scattered object, changed by the replay, is written as version 2 with all its extents.
    // With no room for bodies, every read then goes to the tree: a range lookup for the
    // version 2 objects, the whole record for those still of version 1.
    let tiny = NativeConfig {
        object_cache_bytes: 1,
        metadata_cache_bytes: 8 << 10,
        ..NativeConfig::default()
    };
    let store = block_on(NativeStore::mount(dev.clone(), 0, tiny)).unwrap();
    check(&store, &[]);
    let s = store.stats();
    assert!(s.paged_block_lookups > 0 && s.body_reads > 0, "{s:?}");
    drop(store);
    let store = mount(&dev);
    check(&store, &[]);
    let mut changed = vec![(5, 0x99)];
    submit(&store, |t| {
        t.write(C, "scattered", 5 * BLOCK as u64, block(0x99));
    });
    block_on(store.checkpoint_now()).unwrap();
    // One more block after a checkpoint that keys the extents: only that extent changes.
    let before = store.stats().checkpoint_blocks;
    submit(&store, |t| {
        t.write(C, "scattered", 77 * BLOCK as u64, block(0x31));
    });
    changed.push((77, 0x31));
    block_on(store.checkpoint_now()).unwrap();
    let written = store.stats().checkpoint_blocks - before;
    assert!(
        written <= 3,
        "a one-block overwrite wrote {written} tree nodes"
    );
    // "meta" keeps its version 1 record until it changes; then it gets version 2.
    submit(&store, |t| {
        t.setattr(C, "meta", "user.b", Bytes::from_static(b"beta"));
    });
    check(&store, &changed);
    drop(store);
    let store = mount(&dev);
    check(&store, &changed);
    let attr = block_on(store.getattr(C, "meta", "user.b")).unwrap();
    assert_eq!(attr, Bytes::from_static(b"beta"));
    // An unchanged version 1 object removed: its record goes, and nothing is left of it.
    submit(&store, |t| {
        t.remove(C, "sequential");
    });
    block_on(store.checkpoint_now()).unwrap();
    drop(store);
    let store = mount(&dev);
    assert!(block_on(store.stat(C, "sequential")).is_err());
    assert_eq!(
        read(&store, "late", 0, 2),
        Bytes::from(vec![0x77; 2 * BLOCK])
    );
    drop(store);
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

/// Writes the fixture: run with a format 4 build (see the top of the file).
#[test]
#[ignore]
fn write_the_fixture() {
    let dev = SimDevice::new(16 << 20);
    block_on(mkfs(&dev, 1, 1 << 20)).unwrap();
    let store = mount(&dev);
    submit(&store, |t| {
        t.create_collection(C);
    });
    // Every block its own extent: consecutive writes are 97 blocks apart.
    for i in 0..SCATTERED {
        let l = (i * 97) % SCATTERED;
        submit(&store, |t| {
            t.write(C, "scattered", l * BLOCK as u64, block((l as u8) ^ 0x5a));
        });
    }
    let seq: Vec<u8> = (0..16 * BLOCK).map(|i| (i / BLOCK * 7) as u8).collect();
    submit(&store, |t| {
        t.write(C, "sequential", 0, Bytes::from(seq));
        t.write(C, "meta", 0, block(0x42));
        t.setattr(C, "meta", "user.a", Bytes::from_static(b"alpha"));
        t.omap_set_header(C, "meta", Bytes::from_static(b"hdr"));
        t.write(C, "gone", 0, block(0x13));
    });
    submit(&store, |t| {
        t.remove(C, "gone");
    });
    block_on(store.checkpoint_now()).unwrap();
    // In the journal only.
    for l in REPLAYED {
        submit(&store, |t| {
            t.write(C, "scattered", l * BLOCK as u64, block(0xee));
        });
    }
    submit(&store, |t| {
        t.write(C, "late", 0, Bytes::from(vec![0x77; 2 * BLOCK]));
    });
    check(&store, &[]);
    drop(store);
    let out = std::fs::File::create(FIXTURE).unwrap();
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::best());
    gz.write_all(&dev.image()).unwrap();
    gz.finish().unwrap();
}
