//! Object bodies paged out of memory (decision 0013, step 3): after a checkpoint, clean
//! bodies beyond `object_cache_bytes` leave memory; every kind of read and every kind of
//! change reads them back from the metadata tree first, and nothing reads differently for
//! it — before and after a remount.

use bytes::Bytes;
use carmine_nativestore::{fsck, mkfs, NativeConfig, NativeStore, SimDevice};
use carmine_store::{Expect, ObjectStore, Transaction};
use carmine_types::{CollectionId, PgId};
use futures::executor::block_on;
use std::collections::BTreeMap;

const C: CollectionId = PgId { pool: 3, seed: 1 };
const OBJECTS: usize = 120;

fn config() -> NativeConfig {
    NativeConfig {
        object_cache_bytes: 16 << 10,
        metadata_cache_bytes: 16 << 10,
        ..NativeConfig::default()
    }
}

/// What one object should hold.
#[derive(Clone, Debug, Default, PartialEq)]
struct Obj {
    data: Vec<u8>,
    attrs: BTreeMap<String, Bytes>,
    header: Bytes,
    omap: BTreeMap<Bytes, Bytes>,
}

fn name(i: usize) -> String {
    format!("rbd_data.{i:04}")
}

fn bytes(seed: usize, len: usize) -> Bytes {
    (0..len)
        .map(|k| (seed * 31 + k * 7 + k / 4096) as u8)
        .collect()
}

/// A device of `size` bytes formatted with one shard of 1 MiB segments.
fn formatted(size: usize) -> SimDevice {
    let dev = SimDevice::new(size);
    block_on(mkfs(&dev, 1, 1 << 20)).unwrap();
    dev
}

fn assert_fsck_clean(dev: SimDevice) {
    let report = block_on(fsck(dev, 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

/// Room for no object body and two tree nodes: everything clean is paged out at each
/// checkpoint, and reading back means reading nodes.
fn tiny_caches() -> NativeConfig {
    NativeConfig {
        object_cache_bytes: 1,
        metadata_cache_bytes: 8 << 10,
        ..NativeConfig::default()
    }
}

/// Objects `range`, each with a 300-byte xattr `attr`: records that fill some leaves.
fn fill(store: &NativeStore<SimDevice>, range: std::ops::Range<usize>, attr: &str) {
    for i in range {
        submit(store, |t| {
            t.touch(C, &name(i));
            t.setattr(C, &name(i), attr, bytes(i, 300));
        });
    }
}

fn submit(store: &NativeStore<SimDevice>, build: impl FnOnce(&mut Transaction)) {
    let mut t = Transaction::new();
    build(&mut t);
    block_on(store.submit(t)).unwrap();
}

fn write(model: &mut Obj, off: usize, data: &[u8]) {
    if model.data.len() < off + data.len() {
        model.data.resize(off + data.len(), 0);
    }
    model.data[off..off + data.len()].copy_from_slice(data);
}

/// Reads every object through every kind of read and compares it with the model.
fn check(store: &NativeStore<SimDevice>, model: &BTreeMap<String, Obj>) {
    let listed = block_on(store.list_objects(C, None, usize::MAX)).unwrap();
    assert_eq!(
        listed.items,
        model.keys().cloned().collect::<Vec<_>>(),
        "objects listed"
    );
    for (oid, want) in model {
        let stat = block_on(store.stat(C, oid)).unwrap();
        assert_eq!(stat.size, want.data.len() as u64, "{oid} size");
        let data = block_on(store.read(C, oid, 0, 0)).unwrap();
        assert!(data[..] == want.data[..], "{oid} data");
        assert_eq!(
            block_on(store.getattrs(C, oid)).unwrap(),
            want.attrs,
            "{oid}"
        );
        for (k, v) in &want.attrs {
            assert_eq!(&block_on(store.getattr(C, oid, k)).unwrap(), v, "{oid} {k}");
        }
        assert_eq!(
            block_on(store.omap_get_header(C, oid)).unwrap(),
            want.header
        );
        let page = block_on(store.omap_iterate(C, oid, None, usize::MAX)).unwrap();
        let got: BTreeMap<Bytes, Bytes> = page.items.into_iter().collect();
        assert_eq!(got, want.omap, "{oid} omap");
        let keys: Vec<Bytes> = want.omap.keys().cloned().collect();
        assert_eq!(
            block_on(store.omap_get_values(C, oid, &keys)).unwrap(),
            want.omap,
            "{oid} omap values"
        );
    }
}

fn paged_out_after_checkpoint(store: &NativeStore<SimDevice>) -> u64 {
    block_on(store.checkpoint_now()).unwrap();
    let s = store.stats();
    assert!(
        s.body_resident_bytes <= config().object_cache_bytes,
        "resident bodies take {} bytes, over the budget",
        s.body_resident_bytes
    );
    s.bodies_paged_out
}

#[test]
fn paged_out_bodies_read_back_for_every_read_and_every_change() {
    let dev = formatted(96 << 20);
    let store = block_on(NativeStore::mount(dev.clone(), 0, config())).unwrap();
    submit(&store, |t| {
        t.create_collection(C);
    });
    let mut model: BTreeMap<String, Obj> = BTreeMap::new();
    for i in 0..OBJECTS {
        let oid = name(i);
        let mut o = Obj::default();
        // Scattered blocks, so each object's map has several extents.
        let mut t = Transaction::new();
        for k in 0..4 {
            let off = (k * 3 + i % 3) * 4096;
            let data = bytes(i + k, 4096);
            write(&mut o, off, &data);
            t.write(C, &oid, off as u64, data);
        }
        o.attrs.insert("_".into(), bytes(i, 40));
        o.attrs.insert("snapset".into(), bytes(i + 1, 12));
        o.header = bytes(i, 9);
        for k in 0..6 {
            o.omap.insert(bytes(k, 8), bytes(i * k, 20));
        }
        for (k, v) in &o.attrs {
            t.setattr(C, &oid, k, v.clone());
        }
        t.omap_set_header(C, &oid, o.header.clone());
        t.omap_set(C, &oid, o.omap.clone().into_iter().collect());
        block_on(store.submit(t)).unwrap();
        model.insert(oid, o);
    }
    let out = paged_out_after_checkpoint(&store);
    assert!(out as usize > OBJECTS / 2, "only {out} bodies paged out");

    // Reads of every kind bring them back.
    let before = store.stats().body_reads;
    check(&store, &model);
    assert!(
        store.stats().body_reads - before >= out,
        "reads did not read the paged-out bodies back"
    );

    // Changes of every kind, each to an object paged out just before.
    let out = paged_out_after_checkpoint(&store);
    assert!(out as usize > OBJECTS / 2, "only {out} bodies paged out");
    for i in 0..OBJECTS {
        let oid = name(i);
        match i % 6 {
            0 => {
                // A partial overwrite reads the old block through the object's map.
                let data = bytes(i * 5, 100);
                write(model.get_mut(&oid).unwrap(), 5000, &data);
                submit(&store, |t| {
                    t.write(C, &oid, 5000, data);
                });
            }
            1 => {
                let dst = format!("{oid}.clone");
                let copy = model[&oid].clone();
                model.insert(dst.clone(), copy);
                submit(&store, |t| {
                    t.clone_object(C, &oid, &dst);
                });
            }
            2 => {
                model.remove(&oid);
                submit(&store, |t| {
                    t.remove(C, &oid);
                });
            }
            3 => {
                // A compare judges the paged-out xattr; a failed one changes nothing.
                let v = model[&oid].attrs["snapset"].clone();
                let mut wrong = Transaction::new();
                wrong.compare(
                    C,
                    &oid,
                    Expect::Xattr {
                        name: "snapset".into(),
                        value: Some(Bytes::from_static(b"not it")),
                    },
                );
                wrong.omap_clear(C, &oid);
                assert!(block_on(store.submit(wrong)).is_err());
                let o = model.get_mut(&oid).unwrap();
                o.omap.insert(bytes(99, 3), bytes(i, 3));
                o.attrs.remove("_");
                submit(&store, |t| {
                    t.compare(
                        C,
                        &oid,
                        Expect::Xattr {
                            name: "snapset".into(),
                            value: Some(v),
                        },
                    );
                    t.omap_set(C, &oid, vec![(bytes(99, 3), bytes(i, 3))]);
                    t.rmattr(C, &oid, "_");
                });
            }
            4 => {
                // A range of another paged-out object into this one.
                let src = name(i - 1);
                let part = model[&src].data[4096..4096 + 6000].to_vec();
                write(model.get_mut(&oid).unwrap(), 100, &part);
                submit(&store, |t| {
                    t.clone_range(C, &src, &oid, 4096, 6000, 100);
                });
            }
            _ => {
                let o = model.get_mut(&oid).unwrap();
                o.data.truncate(3000);
                submit(&store, |t| {
                    t.truncate(C, &oid, 3000);
                });
            }
        }
    }
    check(&store, &model);
    paged_out_after_checkpoint(&store);
    check(&store, &model);

    // A remount finds it all, and pages out again at its first checkpoint.
    drop(store);
    let store = block_on(NativeStore::mount(dev.clone(), 0, config())).unwrap();
    assert!(store.stats().bodies_paged_out as usize > OBJECTS / 2);
    check(&store, &model);
    drop(store);
    assert_fsck_clean(dev);
}

/// The cleaner decides what is live from objects' maps: with every body paged out it must
/// read them back, move exactly the live blocks, and lose nothing.
#[test]
fn the_cleaner_reads_paged_out_maps_back_and_moves_only_live_blocks() {
    let dev = formatted(40 << 20);
    let config = NativeConfig {
        object_cache_bytes: 1,
        checkpoint_interval_blocks: 64,
        cache_bytes: 0,
        ..config()
    };
    let store = block_on(NativeStore::mount(dev.clone(), 0, config)).unwrap();
    submit(&store, |t| {
        t.create_collection(C);
    });
    let mut model: BTreeMap<String, Obj> = BTreeMap::new();
    // Fill most of the device, then overwrite parts of it: old segments keep some live
    // blocks, and free ones run short, so the cleaner must move what is live.
    let write_at = |model: &mut BTreeMap<String, Obj>, i: usize, off: usize, seed: usize| {
        let oid = name(i);
        let data = bytes(seed, 16 << 10);
        write(model.entry(oid.clone()).or_default(), off, &data);
        submit(&store, |t| {
            t.write(C, &oid, off as u64, data);
        });
    };
    // Every segment holds blocks of every object; only the first four are overwritten, so
    // the others stay clean (paged out at each checkpoint) and hold the live blocks of the
    // cleaner's victims.
    for k in 0..64 {
        for i in 0..28 {
            write_at(&mut model, i, k * (16 << 10), i * 64 + k);
        }
    }
    for n in 0..1200usize {
        let (i, k) = (n % 4, (n * 13) % 64);
        write_at(&mut model, i, k * (16 << 10), 5000 + n);
    }
    let s = store.stats();
    assert!(s.segments_cleaned > 0, "the cleaner never ran: {s:?}");
    assert_eq!(s.segments_kept, 0, "the cleaner missed live blocks: {s:?}");
    assert!(s.body_reads > 0, "no body was read back: {s:?}");
    check(&store, &model);
    drop(store);
    let store = block_on(NativeStore::mount(dev.clone(), 0, config)).unwrap();
    check(&store, &model);
    drop(store);
    assert_fsck_clean(dev);
}

/// A checkpoint takes an object's changes (marking it clean) some time before they reach the
/// tree; a reader that pages bodies out meanwhile must not page that one out, or reading it
/// back would find its record from before the change.
#[test]
fn a_body_a_checkpoint_is_writing_is_not_paged_out_under_it() {
    use std::future::Future;
    let dev = formatted(96 << 20);
    // Two nodes: the checkpoint has to read the tree back in, and waits for it.
    let config = tiny_caches();
    let store = block_on(NativeStore::mount(dev.clone(), 0, config)).unwrap();
    submit(&store, |t| {
        t.create_collection(C);
    });
    fill(&store, 0..200, "v");
    block_on(store.checkpoint_now()).unwrap();
    assert_eq!(store.stats().bodies_paged_out, 200);
    dev.slow_reads();
    let new = Bytes::from_static(b"changed");
    submit(&store, |t| {
        t.setattr(C, &name(0), "v", new.clone());
    });
    // Reading its body back for the change loaded its leaf: other reads push that out of the
    // node cache (not the dirty body), so the checkpoint has to read it again.
    for j in (20..200).step_by(10) {
        block_on(store.getattr(C, &name(j), "v")).unwrap();
    }
    let mut cp = Box::pin(store.checkpoint_now());
    let waker = futures::task::noop_waker();
    let polled = cp
        .as_mut()
        .poll(&mut std::task::Context::from_waker(&waker));
    assert!(polled.is_pending(), "the checkpoint waits for a node read");
    // Another object read back meanwhile makes room by paging bodies out.
    assert_eq!(
        block_on(store.getattr(C, &name(150), "v")).unwrap(),
        bytes(150, 300)
    );
    assert_eq!(block_on(store.getattr(C, &name(0), "v")).unwrap(), new);
    block_on(cp).unwrap();
    assert_eq!(block_on(store.getattr(C, &name(0), "v")).unwrap(), new);
    drop(store);
    let store = block_on(NativeStore::mount(dev, 0, config)).unwrap();
    assert_eq!(block_on(store.getattr(C, &name(0), "v")).unwrap(), new);
    assert!(store.failure().is_none());
}

/// A record over many more leaves than the node cache holds is read back piece by piece,
/// the nodes read for its first pieces dropped again before its last ones are read.
#[test]
fn a_record_larger_than_the_node_cache_reads_back() {
    let dev = formatted(96 << 20);
    let store = block_on(NativeStore::mount(dev.clone(), 0, config())).unwrap();
    let omap: BTreeMap<Bytes, Bytes> = (0..600)
        .map(|k| (bytes(k, 16), bytes(k * 3, 1000)))
        .collect();
    submit(&store, |t| {
        t.create_collection(C);
        t.touch(C, "big");
        t.omap_set(C, "big", omap.clone().into_iter().collect());
    });
    for i in 0..50 {
        submit(&store, |t| {
            t.touch(C, &name(i));
        });
    }
    block_on(store.checkpoint_now()).unwrap();
    // Distinct keys: 256 entries of 1 KiB, over some 65 leaves; the node cache holds 4.
    assert_eq!(omap.len(), 256);
    let s = store.stats();
    assert!(s.metadata_nodes > 60, "{s:?}");
    assert!(s.bodies_paged_out >= 1, "{s:?}");
    let page = block_on(store.omap_iterate(C, "big", None, usize::MAX)).unwrap();
    assert_eq!(page.items.into_iter().collect::<BTreeMap<_, _>>(), omap);
    let s = store.stats();
    assert!(s.body_reads >= 1 && s.body_node_reads > 60, "{s:?}");
}

/// Transactions apply in the order they were submitted, also when the bodies they need are
/// being read back: the earlier one takes its place in line before it reads.
#[test]
fn transactions_waiting_for_bodies_keep_their_order() {
    let dev = formatted(96 << 20);
    let config = tiny_caches();
    let store = block_on(NativeStore::mount(dev.clone(), 0, config)).unwrap();
    // "x" and "y" far apart in the tree (ids go up with creation), so that reading one back
    // does not bring the other's leaf, and neither in the last leaf (which the node cache
    // keeps).
    submit(&store, |t| {
        t.create_collection(C);
    });
    for (oid, from) in [("x", 0), ("y", 50)] {
        submit(&store, |t| {
            t.write(C, oid, 0, bytes(0, 4096));
        });
        fill(&store, from..from + 50, "_");
    }
    block_on(store.checkpoint_now()).unwrap();
    assert_eq!(store.stats().bodies_paged_out, 102);
    dev.slow_reads();
    // The first needs two bodies read back, the second one of them.
    let mut first = Transaction::new();
    first.write(C, "x", 0, bytes(1, 4096));
    first.write(C, "y", 0, bytes(1, 4096));
    let mut second = Transaction::new();
    second.write(C, "x", 0, bytes(2, 4096));
    let (a, b) = block_on(futures::future::join(
        store.submit(first),
        store.submit(second),
    ));
    a.unwrap();
    b.unwrap();
    assert_eq!(
        block_on(store.read(C, "x", 0, 0)).unwrap(),
        bytes(2, 4096),
        "the later write must win"
    );
}

/// A reader gathering a record over several node reads must not finish it with pieces of a
/// newer record: here the object is read back, changed (same length), checkpointed and paged
/// out again while the reader waits for its second leaf.
#[test]
fn a_record_replaced_while_it_is_being_read_back_is_read_again_whole() {
    use std::future::Future;
    let dev = formatted(96 << 20);
    let config = tiny_caches();
    let store = block_on(NativeStore::mount(dev.clone(), 0, config)).unwrap();
    let (old, new) = (bytes(1, 100), bytes(2, 100));
    // The xattr is early in the record, the omap makes it span more than one leaf.
    submit(&store, |t| {
        t.create_collection(C);
        t.setattr(C, "x", "v", old.clone());
        t.omap_set(
            C,
            "x",
            (0..8).map(|k| (bytes(k, 8), bytes(k, 1000))).collect(),
        );
    });
    fill(&store, 0..60, "_");
    block_on(store.checkpoint_now()).unwrap();
    dev.slow_reads();
    let mut reader = Box::pin(store.getattr(C, "x", "v"));
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    // Two rounds: the first leaf read and its pieces taken, the second leaf asked for.
    for _ in 0..2 {
        assert!(reader.as_mut().poll(&mut cx).is_pending());
    }
    submit(&store, |t| {
        t.setattr(C, "x", "v", new.clone());
    });
    block_on(store.checkpoint_now()).unwrap();
    assert_eq!(block_on(reader).unwrap(), new);
}

/// A read of a paged-out object looks up the extent entries of its range in the tree and
/// leaves the body paged out: a miss costs the leaf holding the range, not the whole map.
/// Reads that start inside a long extent, span holes or pass the end read as a resident
/// body would; a remount reads the same.
#[test]
fn a_read_of_a_paged_out_object_looks_up_its_range_only() {
    let dev = formatted(64 << 20);
    let store = block_on(NativeStore::mount(dev.clone(), 0, tiny_caches())).unwrap();
    let mut model = vec![0u8; 0];
    let write = |store: &NativeStore<SimDevice>, model: &mut Vec<u8>, at: usize, data: Bytes| {
        let mut t = Transaction::new();
        t.write(C, "vol", at as u64, data.clone());
        block_on(store.submit(t)).unwrap();
        if model.len() < at + data.len() {
            model.resize(at + data.len(), 0);
        }
        model[at..at + data.len()].copy_from_slice(&data);
    };
    let mut t = Transaction::new();
    t.create_collection(C);
    block_on(store.submit(t)).unwrap();
    // Scattered single blocks over 0..600, then one long extent at 700..900, a hole, and
    // a last block at 1,000.
    for i in 0..600usize {
        let l = (i * 7) % 600;
        write(&store, &mut model, l * 4096, bytes(l, 4096));
    }
    write(&store, &mut model, 700 * 4096, bytes(9, 200 * 4096));
    write(&store, &mut model, 1000 * 4096, bytes(1, 4096));
    block_on(store.checkpoint_now()).unwrap();
    let check = |store: &NativeStore<SimDevice>, model: &[u8]| {
        for (first, blocks) in [
            (0, 1),
            (599, 1),
            (5, 40),
            (750, 3),
            (899, 2),
            (880, 70),
            (1000, 5),
        ] {
            let (off, len) = (first * 4096, blocks * 4096);
            let before = store.stats();
            let got = block_on(store.read(C, "vol", off as u64, len as u64)).unwrap();
            let after = store.stats();
            let end = (off + len).min(model.len());
            assert!(got[..] == model[off..end], "blocks {first}+{blocks}");
            assert_eq!(
                after.body_reads, before.body_reads,
                "the body was read back"
            );
            assert_eq!(after.paged_block_lookups, before.paged_block_lookups + 1);
        }
        let all = block_on(store.read(C, "vol", 0, 0)).unwrap();
        assert!(all[..] == model[..], "the whole object");
    };
    check(&store, &model);
    assert_eq!(store.stats().bodies_paged_out, 1);
    drop(store);
    let store = block_on(NativeStore::mount(dev.clone(), 0, tiny_caches())).unwrap();
    check(&store, &model);
    // A change reads the body back, and reads then use it.
    write(&store, &mut model, 3 * 4096, bytes(77, 4096));
    let lookups = store.stats().paged_block_lookups;
    let got = block_on(store.read(C, "vol", 0, 8 * 4096)).unwrap();
    assert!(got[..] == model[..8 * 4096]);
    assert_eq!(store.stats().paged_block_lookups, lookups, "resident now");
    drop(store);
    assert_fsck_clean(dev);
}
