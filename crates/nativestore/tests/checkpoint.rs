//! Checkpoints into the metadata tree: a checkpoint writes what changed, not the whole index;
//! metadata segments are freed as their nodes are replaced; a small node cache makes
//! checkpoints read what they change back in; and every remount finds what was written.

use bytes::Bytes;
use carmine_nativestore::{fsck, mkfs, NativeConfig, NativeStore, SimDevice};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::{CollectionId, PgId};
use futures::executor::block_on;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

const C: CollectionId = PgId { pool: 1, seed: 0 };
const SEGMENT: u32 = 1 << 20;

fn formatted() -> SimDevice {
    let dev = SimDevice::new(160 << 20);
    block_on(mkfs(&dev, 1, SEGMENT)).unwrap();
    dev
}

fn mount(dev: &SimDevice, config: NativeConfig) -> NativeStore<SimDevice> {
    block_on(NativeStore::mount(dev.clone(), 0, config)).unwrap()
}

fn submit(store: &NativeStore<SimDevice>, build: impl FnOnce(&mut Transaction)) {
    let mut t = Transaction::new();
    build(&mut t);
    block_on(store.submit(t)).unwrap();
}

fn name(i: usize) -> String {
    format!("object-{i:05}")
}

/// Each object: one xattr holding its version (what the model keeps), padded so that a few
/// thousand objects fill several segments with nodes.
fn set_version(store: &NativeStore<SimDevice>, i: usize, v: u32) {
    submit(store, |t| {
        t.touch(C, &name(i));
        t.setattr(C, &name(i), "v", value(v));
    });
}

fn value(v: u32) -> Bytes {
    let mut b = v.to_le_bytes().to_vec();
    b.resize(200, 0xee);
    Bytes::from(b)
}

fn check(store: &NativeStore<SimDevice>, model: &BTreeMap<usize, u32>) {
    // A page may hold fewer than asked for: follow `next`.
    let (mut listed, mut after) = (0, None);
    loop {
        let page = block_on(store.list_objects(C, after.as_deref(), usize::MAX)).unwrap();
        listed += page.items.len();
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(listed, model.len(), "objects listed");
    for (&i, &v) in model {
        let got = block_on(store.getattr(C, &name(i), "v"))
            .unwrap_or_else(|e| panic!("{}: {e}", name(i)));
        assert_eq!(got, value(v), "{}", name(i));
    }
}

/// Tiny caches: two tree nodes, no object body kept (each is read back through the tree).
fn tiny_caches() -> NativeConfig {
    NativeConfig {
        metadata_cache_bytes: 8 << 10,
        object_cache_bytes: 1,
        ..NativeConfig::default()
    }
}

/// A store of objects `0..n` at version 1, checkpointed, and its model.
fn checkpointed(
    n: usize,
    config: NativeConfig,
) -> (SimDevice, NativeStore<SimDevice>, BTreeMap<usize, u32>) {
    let dev = formatted();
    let store = mount(&dev, config);
    submit(&store, |t| {
        t.create_collection(C);
    });
    let mut model = BTreeMap::new();
    for i in 0..n {
        set_version(&store, i, 1);
        model.insert(i, 1);
    }
    block_on(store.checkpoint_now()).unwrap();
    (dev, store, model)
}

#[test]
fn a_checkpoint_writes_what_changed_not_the_whole_index() {
    let dev = formatted();
    let store = mount(&dev, NativeConfig::default());
    submit(&store, |t| {
        t.create_collection(C);
    });
    for i in 0..8000 {
        set_version(&store, i, 1);
    }
    block_on(store.checkpoint_now()).unwrap();
    let whole = store.stats().checkpoint_blocks;
    assert!(whole > 30, "8,000 objects take many nodes ({whole})");
    // One object changes: its leaf and the path above it are written, nothing else.
    set_version(&store, 4321, 2);
    block_on(store.checkpoint_now()).unwrap();
    let one = store.stats().checkpoint_blocks - whole;
    eprintln!("checkpoint blocks: all objects {whole}, one object {one}");
    assert!(
        (1..=4).contains(&one),
        "{one} blocks written for one changed object (the first checkpoint wrote {whole})"
    );
    // Every object changes: every node is replaced, and the segments the old ones filled
    // are freed (not left for a later rewrite of the whole tree).
    for i in 0..8000 {
        set_version(&store, i, 3);
    }
    block_on(store.checkpoint_now()).unwrap();
    let s = store.stats();
    assert_eq!(
        s.tree_rewrites, 1,
        "only the first checkpoint wrote a fresh tree"
    );
    let per_segment = (SEGMENT / 4096 - 1) as u64;
    assert!(
        s.metadata_segments <= s.metadata_nodes.div_ceil(per_segment) + 1,
        "{} metadata segments for {} nodes",
        s.metadata_segments,
        s.metadata_nodes
    );
}

/// A checkpoint of hundreds of adjacent nodes writes them a bounded piece at a time (256
/// blocks), so it never holds them encoded all at once; they all read back, before and after
/// a remount, whichever piece they were written in.
#[test]
fn a_checkpoint_of_many_nodes_writes_them_a_bounded_piece_at_a_time() {
    let (dev, store, model) = checkpointed(12_000, NativeConfig::default());
    let written = store.stats().checkpoint_blocks;
    assert!(
        written > 2 * 256,
        "{written} blocks: too few nodes to need several pieces"
    );
    assert!(
        dev.largest_write() <= 256 * 4096,
        "a write of {} blocks",
        dev.largest_write() / 4096
    );
    check(&store, &model);
    drop(store);
    let store = mount(&dev, NativeConfig::default());
    check(&store, &model);
    drop(store);
    let report = block_on(fsck(dev, 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

/// Random changes, checkpoints and remounts with a node cache of two nodes: the tree is read
/// back in by every checkpoint, metadata segments are reused, and nothing is lost.
#[test]
fn random_changes_keep_their_values_and_metadata_space_stays_bounded() {
    let seed: u64 = std::env::var("CARMINE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("CARMINE_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let config = NativeConfig {
        metadata_cache_bytes: 8 << 10,
        checkpoint_interval_blocks: 200,
        ..NativeConfig::default()
    };
    let dev = formatted();
    let mut store = mount(&dev, config);
    submit(&store, |t| {
        t.create_collection(C);
    });
    let mut model: BTreeMap<usize, u32> = BTreeMap::new();
    let mut most_used = 0;
    for round in 0..60 {
        for _ in 0..rng.random_range(1..200) {
            let i = rng.random_range(0..1500);
            if rng.random_ratio(1, 4) && model.contains_key(&i) {
                submit(&store, |t| {
                    t.remove(C, &name(i));
                });
                model.remove(&i);
            } else {
                let v = rng.random();
                set_version(&store, i, v);
                model.insert(i, v);
            }
        }
        match round % 3 {
            0 => block_on(store.checkpoint_now()).unwrap(),
            1 => {
                drop(store);
                store = mount(&dev, config);
            }
            _ => {}
        }
        assert!(store.failure().is_none(), "{:?}", store.failure());
        let (free, total) = store.segments_free();
        most_used = most_used.max(total - free);
    }
    check(&store, &model);
    drop(store);
    let store = mount(&dev, config);
    check(&store, &model);
    // fsck reads the same tree back and finds every data block where the index says.
    let report = block_on(fsck(dev.clone(), 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.mount.metadata_nodes, store.stats().metadata_nodes);
    assert!(report.mount.metadata_nodes > 1);
    // 1,500 small objects need well under a segment of metadata; the journal a few more.
    assert!(
        most_used <= 12,
        "{most_used} segments in use at most: metadata segments are not being freed"
    );
}

/// Removing the newest objects empties the tree's last leaves; the next object's record then
/// belongs in a leaf no change read before (the review found this failed the shard). Where
/// the last leaf starts depends on record sizes, so every cut near the end is tried.
#[test]
fn a_record_routed_to_a_leaf_not_read_yet_is_read_in() {
    let config = NativeConfig {
        metadata_cache_bytes: 8 << 10,
        ..NativeConfig::default()
    };
    for cut in 1970..2000 {
        let dev = formatted();
        let store = mount(&dev, config);
        submit(&store, |t| {
            t.create_collection(C);
        });
        let mut model = BTreeMap::new();
        for i in 0..2000 {
            set_version(&store, i, 1);
            model.insert(i, 1);
        }
        block_on(store.checkpoint_now()).unwrap();
        for i in cut..2000 {
            submit(&store, |t| {
                t.remove(C, &name(i));
            });
            model.remove(&i);
        }
        set_version(&store, 5000, 9);
        model.insert(5000, 9);
        block_on(store.checkpoint_now()).unwrap();
        assert!(
            store.failure().is_none(),
            "cut {cut}: {:?}",
            store.failure()
        );
        drop(store);
        check(&mount(&dev, config), &model);
    }
}

/// A checkpoint whose future is dropped half way (its caller went away: a client's write that
/// had to checkpoint first, say) has taken the index's dirty marks but put them in no tree.
/// Going on would let the next checkpoint retire journal records nothing else holds: the
/// shard stops instead, and a remount finds every acknowledged change.
#[test]
fn a_checkpoint_dropped_half_way_stops_the_shard_and_loses_nothing() {
    use std::future::Future;
    let dev = formatted();
    let config = NativeConfig::default();
    let store = mount(&dev, config);
    submit(&store, |t| {
        t.create_collection(C);
    });
    let mut model = BTreeMap::new();
    for i in 0..50 {
        set_version(&store, i, 1);
        model.insert(i, 1);
    }
    let mut cp = Box::pin(store.checkpoint_now());
    let waker = futures::task::noop_waker();
    let polled = cp
        .as_mut()
        .poll(&mut std::task::Context::from_waker(&waker));
    assert!(polled.is_pending(), "the checkpoint waits for its writes");
    drop(cp);
    let why = store.failure().expect("the shard stops");
    assert!(why.contains("abandoned"), "{why}");
    let mut t = Transaction::new();
    t.touch(C, "after");
    assert!(block_on(store.submit(t)).is_err());
    drop(store);
    let store = mount(&dev, config);
    check(&store, &model);
}

/// A tree that shrank to a third of its entries is written afresh, in one streaming pass over
/// the old one with a node cache of two nodes, holding its read ahead and not the tree (nor
/// what its changes reach): every object keeps its value across the rewrite and a remount,
/// read back through the new tree, and the old nodes' segments are freed.
#[test]
fn a_tree_written_afresh_streams_through_a_tiny_cache_and_keeps_everything() {
    // Enough objects that the tree is many times the node cache and the read ahead: the
    // scan must hold its read ahead and a path, never the tree.
    const N: usize = 24_000;
    // Bodies are read back through the new tree afterwards, not kept.
    let config = tiny_caches();
    let (dev, store, mut model) = checkpointed(N, config);
    let full = store.stats();
    // Half the objects go (deletion does not merge nodes): not yet worth a fresh tree.
    for i in (0..N).filter(|i| i % 2 == 1) {
        submit(&store, |t| {
            t.remove(C, &name(i));
        });
        model.remove(&i);
    }
    block_on(store.checkpoint_now()).unwrap();
    let half = store.stats();
    assert_eq!(half.tree_rewrites, full.tree_rewrites, "{half:?}");
    // A third of what is left goes, all from the first leaves, and a few change: the tree
    // is written afresh now, most of it read from the device by the rewrite itself (the
    // cache holds two nodes, and the changes reach only the first leaves).
    for i in (0..N / 2).step_by(2) {
        submit(&store, |t| {
            t.remove(C, &name(i));
        });
        model.remove(&i);
    }
    for i in (4000..N).step_by(20) {
        set_version(&store, i, 2);
        model.insert(i, 2);
    }
    let reads = dev.bytes_read();
    block_on(store.checkpoint_now()).unwrap();
    let after = store.stats();
    assert!(store.failure().is_none(), "{:?}", store.failure());
    assert_eq!(
        after.tree_rewrites,
        half.tree_rewrites + 1,
        "the shrunk tree is written afresh: {after:?}"
    );
    let read_nodes = (dev.bytes_read() - reads) / 4096;
    eprintln!(
        "rewrite read {read_nodes} nodes, held {} at most; {} nodes before, {} after",
        after.tree_rewrite_nodes_held_max, half.metadata_nodes, after.metadata_nodes
    );
    // Its read ahead (64 nodes) and a path, not the tree, and not the nodes its changes
    // reach: they are merged into the scan, the old tree never changed.
    assert!(
        after.tree_rewrite_nodes_held_max <= 64 + 8,
        "the rewrite held {} nodes at once",
        after.tree_rewrite_nodes_held_max
    );
    assert!(
        read_nodes * 2 > half.metadata_nodes,
        "the rewrite read {read_nodes} of {} nodes",
        half.metadata_nodes
    );
    assert!(
        after.metadata_nodes * 2 < half.metadata_nodes,
        "{} nodes after, {} before",
        after.metadata_nodes,
        half.metadata_nodes
    );
    assert!(
        after.metadata_segments < half.metadata_segments,
        "the old nodes' segments are freed"
    );
    check(&store, &model);
    drop(store);
    let store = mount(&dev, config);
    check(&store, &model);
    drop(store);
    let report = block_on(fsck(dev, 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

/// A crash at any write of a checkpoint that writes the tree afresh loses nothing: here the
/// first checkpoint after a remount, which replays the removals that left the tree wasteful
/// and writes it afresh. The next mount finds every acknowledged object, from the old tree
/// and the journal or from the new tree, whatever the crash left of unsynced writes.
#[test]
fn a_crash_at_any_write_of_a_tree_rewrite_loses_nothing() {
    let config = tiny_caches();
    let (dev, store, mut model) = checkpointed(3000, config);
    for i in (0..3000).filter(|i| i % 3 != 0) {
        submit(&store, |t| {
            t.remove(C, &name(i));
        });
        model.remove(&i);
    }
    for i in (0..3000).step_by(30) {
        set_version(&store, i, 2);
        model.insert(i, 2);
    }
    block_on(store.flush()).unwrap();
    drop(store);
    let image = dev.image();
    // Undisturbed, the mount's checkpoint writes the tree afresh in this many writes.
    let probe = SimDevice::from_image(image.clone());
    let (writes_before, _, _) = probe.counters();
    let store = mount(&probe, config);
    assert_eq!(store.stats().tree_rewrites, 1, "{:?}", store.stats());
    let writes = probe.counters().0 - writes_before;
    drop(store);
    assert!(writes > 4, "{writes} writes");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for k in 0..writes {
        let dying = SimDevice::from_image(image.clone());
        dying.die_at_write(k);
        let crashed = block_on(NativeStore::mount(dying.clone(), 0, config));
        assert!(crashed.is_err() || !dying.is_dead(), "write {k}");
        drop(crashed);
        let after = SimDevice::from_image(dying.crash(&mut rng).0);
        let store = mount(&after, config);
        check(&store, &model);
        drop(store);
    }
}

/// A nearly full store whose checkpoint finds more changed nodes than free room. The tree
/// holds half the entries it has nodes for (removals do not merge nodes), so the
/// reserve kept for a fresh tree of the index is less than the tree; the store is filled with
/// data up to that reserve; then removals that change every leaf leave a checkpoint more
/// changed nodes than room, and it writes the tree afresh, its changes applied first.
/// Nothing is lost: the objects kept, the ones removed, and the data that filled the device,
/// across a remount, with a clean fsck.
#[test]
fn a_checkpoint_short_of_room_for_its_changes_writes_the_tree_afresh() {
    const N: usize = 24_000;
    // Small segments, so that the reserve is close to the size of a fresh tree.
    let dev = SimDevice::new(64 << 20);
    block_on(mkfs(&dev, 1, 64 * 4096)).unwrap();
    // A small reserve for the cleaner's throttle, so that user data may fill the store
    // up to what the checkpoint keeps for itself: a fresh tree.
    let config = NativeConfig {
        throttle_pct: 1,
        clean_start_pct: 2,
        ..tiny_caches()
    };
    let store = mount(&dev, config);
    // The data that fills the store goes to a collection of its own.
    const FILL: CollectionId = PgId { pool: 1, seed: 1 };
    submit(&store, |t| {
        t.create_collection(C);
        t.create_collection(FILL);
    });
    let mut model = BTreeMap::new();
    for i in 0..N {
        set_version(&store, i, 1);
        model.insert(i, 1);
    }
    // Removals in a few transactions (they may use the last reserve), so that no checkpoint
    // comes between them and each one after changes every leaf.
    let remove = |store: &NativeStore<SimDevice>, model: &mut BTreeMap<usize, u32>, step| {
        let gone: Vec<usize> = model.keys().copied().step_by(step).collect();
        for part in gone.chunks(2000) {
            submit(store, |t| {
                for &i in part {
                    t.remove(C, &name(i));
                }
            });
            for i in part {
                model.remove(i);
            }
        }
        block_on(store.checkpoint_now()).unwrap();
    };
    remove(&store, &mut model, 2);
    let wasteful = store.stats();
    // Data until the store refuses it.
    let chunk = |k: usize| Bytes::from(vec![(k % 251) as u8 + 1; 64 << 10]);
    let place = |k: usize| (format!("fill-{}", k / 64), (k % 64) as u64 * (64 << 10));
    let mut filled = 0;
    loop {
        let mut t = Transaction::new();
        let (oid, off) = place(filled);
        t.write(FILL, &oid, off, chunk(filled));
        match block_on(store.submit(t)) {
            Ok(()) => filled += 1,
            Err(e) if e.kind == carmine_store::StoreErrorKind::NoSpace => break,
            Err(e) => panic!("fill {filled}: {e}"),
        }
    }
    block_on(store.checkpoint_now()).unwrap();
    let before = store.stats();
    remove(&store, &mut model, 6);
    let after = store.stats();
    eprintln!(
        "tree of {} nodes for {} objects; {filled} chunks of 64 KiB filled the store; \
         rewrites {} -> {} ({} for room), {} nodes after",
        wasteful.metadata_nodes,
        N / 2,
        before.tree_rewrites,
        after.tree_rewrites,
        after.tree_rewrites_for_room,
        after.metadata_nodes,
    );
    assert!(store.failure().is_none(), "{:?}", store.failure());
    assert_eq!(
        after.tree_rewrites_for_room,
        before.tree_rewrites_for_room + 1,
        "the changed nodes did not fit: {after:?}"
    );
    let check_all = |store: &NativeStore<SimDevice>| {
        check(store, &model);
        for k in (0..filled).step_by(7) {
            let (oid, off) = place(k);
            let got = block_on(store.read(FILL, &oid, off, 64 << 10)).unwrap();
            assert_eq!(got, chunk(k), "fill chunk {k}");
        }
    };
    check_all(&store);
    drop(store);
    let store = mount(&dev, config);
    check_all(&store);
    drop(store);
    let report = block_on(fsck(dev, 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

/// Readers during a checkpoint do not grow the tree past its node cache: nothing may be
/// evicted while a checkpoint is under way, so a reader with the cache full walks down to
/// the leaf it needs without keeping what it read. Here a checkpoint that changes the first
/// quarter of the objects is stopped half way while 500 paged-out bodies of the rest are
/// read back, and 20 whose records span leaves.
#[test]
fn readers_during_a_checkpoint_keep_the_tree_within_its_cache() {
    use std::future::Future;
    const N: usize = 8_000;
    let config = tiny_caches();
    let (_dev, store, mut model) = checkpointed(N, config);
    // And some objects whose records span leaves (a piece is a quarter node).
    let big = |k: usize| Bytes::from(vec![k as u8; 9_000 + k]);
    for k in 0..20 {
        submit(&store, |t| {
            t.touch(C, &format!("big-{k}"));
            t.setattr(C, &format!("big-{k}"), "v", big(k));
        });
    }
    block_on(store.checkpoint_now()).unwrap();
    for i in 0..N / 4 {
        set_version(&store, i, 2);
        model.insert(i, 2);
    }
    let mut cp = Box::pin(store.checkpoint_now());
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    // Into the checkpoint: its changes hold nodes in memory, beyond the cache.
    let mut polls = 0;
    while store.stats().metadata_nodes_loaded < 16 {
        assert!(
            cp.as_mut().poll(&mut cx).is_pending(),
            "the checkpoint ended early"
        );
        polls += 1;
        assert!(polls < 10_000, "the checkpoint never loaded its nodes");
    }
    let held = store.stats().metadata_nodes_loaded;
    let reads_before = store.stats().body_node_reads;
    for i in (N / 2..N).step_by(8) {
        let got = block_on(store.getattr(C, &name(i), "v")).unwrap();
        assert_eq!(got, value(model[&i]), "{}", name(i));
    }
    for k in 0..20 {
        let got = block_on(store.getattr(C, &format!("big-{k}"), "v")).unwrap();
        assert_eq!(got, big(k), "big-{k}");
    }
    let during = store.stats();
    eprintln!(
        "checkpoint held {held} nodes after {polls} polls; {} after {} reads ({} node reads)",
        during.metadata_nodes_loaded,
        N / 16,
        during.body_node_reads - reads_before
    );
    assert!(
        during.body_node_reads - reads_before >= (N / 16) as u64,
        "the bodies were read back through the tree"
    );
    assert!(
        during.metadata_nodes_loaded <= held + 8,
        "readers grew the tree from {held} to {} nodes",
        during.metadata_nodes_loaded
    );
    block_on(cp).unwrap();
    assert!(store.failure().is_none(), "{:?}", store.failure());
    for k in 0..20 {
        submit(&store, |t| {
            t.remove(C, &format!("big-{k}"));
        });
    }
    check(&store, &model);
}

/// A bad byte in a node a reader walks past the full cache during a checkpoint: the read
/// fails and the shard stops (metadata it cannot trust), never an answer from the damaged
/// node.
#[test]
fn a_damaged_node_met_by_a_reader_during_a_checkpoint_is_an_error_never_data() {
    use std::future::Future;
    const N: usize = 8_000;
    let (dev, store, _model) = checkpointed(N, tiny_caches());
    for i in 0..N / 4 {
        set_version(&store, i, 2);
    }
    // Every block on the device holding the name of the object read below: its leaf in the
    // tree (and journal records, which this test never replays).
    let victim = name(7_000);
    let image = dev.image();
    let hits: Vec<usize> = image
        .chunks_exact(4096)
        .enumerate()
        .filter(|(_, b)| b.windows(victim.len()).any(|w| w == victim.as_bytes()))
        .map(|(i, _)| i)
        .collect();
    assert!(!hits.is_empty());
    for block in hits {
        // Inside the node, after its header: the entry bytes.
        dev.flip_bit((block * 4096 + 2000) as u64, 3);
    }
    let mut cp = Box::pin(store.checkpoint_now());
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut polls = 0;
    while store.stats().metadata_nodes_loaded < 16 {
        assert!(cp.as_mut().poll(&mut cx).is_pending());
        polls += 1;
        assert!(polls < 10_000);
    }
    let err = block_on(store.getattr(C, &victim, "v")).expect_err("read a damaged node");
    assert!(err.to_string().contains("metadata"), "{err}");
    assert!(
        store.failure().is_some(),
        "the shard goes on with a damaged tree"
    );
    drop(cp);
}

/// Format 5 keys each extent on its own: after one 4 KiB overwrite of a randomly written
/// 4 MiB object (1,024 extents, ~35 KB of tree entries), a checkpoint writes the leaf of that
/// extent and the path above it, not the object's whole map (a format 4 record: ~25 KB, seven
/// leaves and more). The same after a punch, and after a size change (its record's leaf).
#[test]
fn one_block_overwrite_checkpoints_one_leaf_and_its_path() {
    let dev = formatted();
    let store = mount(&dev, NativeConfig::default());
    const BLOCKS: u64 = 1024;
    let data = |l: u64, v: u8| Bytes::from(vec![(l as u8) ^ v; 4096]);
    submit(&store, |t| {
        t.create_collection(C);
    });
    // 331 is odd: every block once, consecutive writes far apart (no two join).
    for i in 0..BLOCKS {
        let l = (i * 331) % BLOCKS;
        submit(&store, |t| {
            t.write(C, "volume", l * 4096, data(l, 1));
        });
    }
    block_on(store.checkpoint_now()).unwrap();
    let nodes = store.stats().metadata_nodes;
    assert!(nodes >= 8, "{nodes} tree nodes for 1,024 extents");
    let mut expect: Vec<u8> = (0..BLOCKS).flat_map(|l| data(l, 1).to_vec()).collect();
    let mut written = Vec::new();
    for (l, change) in [(517u64, "overwrite"), (12, "punch"), (900, "grow")] {
        let before = store.stats().checkpoint_blocks;
        submit(&store, |t| match change {
            "overwrite" => {
                t.write(C, "volume", l * 4096, data(l, 2));
            }
            "punch" => {
                t.zero(C, "volume", l * 4096, 4096);
            }
            _ => {
                t.truncate(C, "volume", BLOCKS * 4096 + 4096);
            }
        });
        match change {
            "overwrite" => expect[l as usize * 4096..][..4096].copy_from_slice(&data(l, 2)),
            "punch" => expect[l as usize * 4096..][..4096].fill(0),
            _ => expect.resize(expect.len() + 4096, 0),
        }
        block_on(store.checkpoint_now()).unwrap();
        written.push((change, store.stats().checkpoint_blocks - before));
    }
    eprintln!("tree of {nodes} nodes; nodes written per checkpoint: {written:?}");
    for (change, w) in &written {
        // A leaf and the root above it (a tree of this size has two levels).
        assert!(*w <= 2, "{change} wrote {w} nodes: {written:?}");
    }
    let got = block_on(store.read(C, "volume", 0, expect.len() as u64)).unwrap();
    assert!(got == expect, "read back after the checkpoints");
    drop(store);
    let store = mount(&dev, tiny_caches());
    let got = block_on(store.read(C, "volume", 0, expect.len() as u64)).unwrap();
    assert!(got == expect, "read back after a remount, through the tree");
}

/// Changed object bodies stay in memory until a checkpoint writes them: once they pass
/// `dirty_metadata_bytes`, the background brings the checkpoint forward (here the interval
/// alone would never come), a segment of journal apart at the least. Below it, it waits for
/// the interval.
#[test]
fn changed_bodies_past_their_bound_bring_a_checkpoint_forward() {
    for (cache, forward) in [(64 << 10, true), (64 << 20, false)] {
        let config = NativeConfig {
            object_cache_bytes: cache,
            dirty_metadata_bytes: cache,
            checkpoint_interval_blocks: 1 << 40,
            ..NativeConfig::default()
        };
        let dev = formatted();
        let store = mount(&dev, config);
        submit(&store, |t| {
            t.create_collection(C);
        });
        let at_start = store.stats().checkpoints;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let work = async {
            // Scattered blocks of 64 objects: each body grows by an extent per write.
            for i in 0..6_000u32 {
                let oid = format!("volume-{}", rng.random_range(0..64));
                let l = rng.random_range(0..1024u64);
                let mut t = Transaction::new();
                t.write(C, &oid, l * 4096, Bytes::from(vec![i as u8; 4096]));
                store.submit(t).await.unwrap();
                if i % 100 == 0 {
                    for _ in 0..50 {
                        carmine_nativestore::yield_once().await;
                    }
                }
            }
        };
        block_on(async {
            let background = std::pin::pin!(store.background());
            let work = std::pin::pin!(work);
            match futures::future::select(background, work).await {
                futures::future::Either::Right(((), _)) => {}
                futures::future::Either::Left(_) => panic!("the shard failed"),
            }
        });
        let s = store.stats();
        let checkpoints = s.checkpoints - at_start;
        eprintln!("object cache {cache}: {checkpoints} checkpoints, {s:?}");
        if forward {
            // A segment of journal apart at the least.
            let segments = s.device_bytes_written / u64::from(SEGMENT);
            assert!(checkpoints >= 3, "{checkpoints} checkpoints");
            assert!(
                checkpoints <= segments,
                "{checkpoints} for {segments} segments"
            );
        } else {
            assert_eq!(checkpoints, 0, "the bound held every changed body");
        }
        drop(store);
        let store = mount(&dev, config);
        assert_eq!(
            block_on(store.list_objects(C, None, 100))
                .unwrap()
                .items
                .len(),
            64
        );
    }
}

/// An object whose extents were cut, extended and punched since its last checkpoint, then
/// removed, leaves no extent entry behind (a stray one would refuse the next mount), and an
/// object of the same name written in the same interval reads as written.
#[test]
fn a_removed_object_leaves_no_extent_entries_behind() {
    let dev = formatted();
    let store = mount(&dev, NativeConfig::default());
    let block = |v: u8| Bytes::from(vec![v; 4096]);
    submit(&store, |t| {
        t.create_collection(C);
        t.write(C, "vol", 0, Bytes::from(vec![1; 64 * 4096]));
        t.write(C, "keep", 0, block(9));
    });
    block_on(store.checkpoint_now()).unwrap();
    let nodes = store.stats().metadata_nodes;
    // Cut the long extent, append blocks after it, punch across two extents.
    submit(&store, |t| {
        t.write(C, "vol", 10 * 4096, block(2));
    });
    for l in 64..80 {
        submit(&store, |t| {
            t.write(C, "vol", l * 4096, block(3));
        });
    }
    submit(&store, |t| {
        t.zero(C, "vol", 8 * 4096, 5 * 4096);
    });
    // The first block too: the key the tree holds starts no extent any more.
    submit(&store, |t| {
        t.zero(C, "vol", 0, 4096);
    });
    submit(&store, |t| {
        t.remove(C, "vol");
    });
    submit(&store, |t| {
        t.write(C, "vol", 4096, block(4));
    });
    block_on(store.checkpoint_now()).unwrap();
    assert!(store.stats().metadata_nodes <= nodes + 1);
    drop(store);
    let store = mount(&dev, tiny_caches());
    let got = block_on(store.read(C, "vol", 0, 0)).unwrap();
    let mut want = vec![0u8; 4096];
    want.extend_from_slice(&block(4));
    assert!(got == want, "the new object reads as written");
    assert_eq!(block_on(store.read(C, "keep", 0, 0)).unwrap(), block(9));
    drop(store);
    let report = block_on(fsck(dev, 0)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}
