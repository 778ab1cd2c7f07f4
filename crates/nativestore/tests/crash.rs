//! Crash recovery against the reference model.
//!
//! Random transactions run in concurrent groups (so several share a journal record) on a
//! device that dies at a random write. The crash image keeps every synced write and gives
//! each unsynced one a random fate: lost, kept, or torn at a sector boundary. After every
//! remount the store must equal the model with all acknowledged transactions applied plus
//! some prefix of the ones that were in flight — never a part of one. Mounts themselves
//! (which write a checkpoint) are crashed too.

use carmine_nativestore::{fsck, mkfs, NativeConfig, NativeStore, SimDevice};
use carmine_store::conformance::{arb_transaction, diff, dump};
use carmine_store::model::ModelStore;
use carmine_store::{ObjectStore, StoreErrorKind, Transaction};
use carmine_types::PgId;
use futures::executor::block_on;
use futures::future::join_all;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use rand::{Rng, SeedableRng};
use std::future::Future;

const DEVICE: usize = 12 << 20;
const SEGMENT: u32 = 1 << 20;

/// Crash points to run: `CARMINE_CRASH_POINTS` (the long mode: 100000), or the older name
/// `CARMINE_CRASH_ITERATIONS`.
fn iterations() -> u64 {
    std::env::var("CARMINE_CRASH_POINTS")
        .or_else(|_| std::env::var("CARMINE_CRASH_ITERATIONS"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 150 } else { 1500 })
}

fn seed() -> u64 {
    std::env::var("CARMINE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random)
}

/// The run's random source and a proptest runner drawn from it (`CARMINE_SEED` replays).
fn seeded(seed: u64) -> (rand::rngs::StdRng, TestRunner) {
    eprintln!("CARMINE_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &rng.random::<[u8; 32]>()),
    );
    (rng, runner)
}

/// Small checkpoint interval and caches, so checkpoints, cache misses, metadata nodes read
/// back in and the cleaner all run.
fn config() -> NativeConfig {
    NativeConfig {
        cache_bytes: 64 << 10,
        metadata_cache_bytes: 16 << 10,
        // Clean object bodies are paged out at every checkpoint and read back when used.
        object_cache_bytes: 1,
        checkpoint_interval_blocks: 300,
        ..NativeConfig::default()
    }
}

fn failed<D: carmine_nativestore::BlockDevice>(store: &NativeStore<D>) -> bool {
    store.failure().is_some()
}

/// What the store said of a transaction that is not known durable yet.
enum Said {
    /// Applied and queued (its submitter was cancelled): durable once anything after it is.
    Queued,
    /// Refused with this error, judged against a state that included what came before.
    Refused(StoreErrorKind),
    /// Failed with an I/O error: the shard failed, nothing after it is acknowledged.
    Failed,
}

/// Checks one store result against the model. `unacked` holds, in order, what the store
/// applied or judged since the last acknowledgement: an acknowledgement makes all of it
/// durable (the journal is a prefix), so it goes to the model first, each with the outcome
/// the store gave.
async fn judge(
    model: &ModelStore,
    unacked: &mut Vec<(Transaction, Said)>,
    t: Transaction,
    r: carmine_store::Result<()>,
    context: &str,
) {
    match r {
        Ok(()) => {
            for (u, said) in unacked.drain(..) {
                let m = model.submit(u).await.map_err(|e| e.kind);
                match said {
                    Said::Queued => assert_eq!(m, Ok(()), "store queued what the model refused"),
                    Said::Refused(kind) => assert_eq!(m, Err(kind), "store and model disagree"),
                    Said::Failed => panic!("a transaction was acknowledged after {context}"),
                }
            }
            let m = model.submit(t).await;
            assert_eq!(m, Ok(()), "store accepted what the model refused");
        }
        Err(e) if e.kind == StoreErrorKind::Io => unacked.push((t, Said::Failed)),
        Err(e) if !unacked.is_empty() => unacked.push((t, Said::Refused(e.kind))),
        Err(e) => {
            let m = model.submit(t).await.map_err(|e| e.kind);
            assert_eq!(m, Err(e.kind), "store and model disagree: {e}");
        }
    }
}

fn setup_txn() -> Transaction {
    let mut t = Transaction::new();
    t.create_collection(PgId { pool: 1, seed: 0 })
        .create_collection(PgId { pool: 1, seed: 1 })
        .create_collection(BULK);
    t
}

/// A collection of its own for bulk transactions, which the random ones never touch.
const BULK: PgId = PgId { pool: 2, seed: 0 };
const BULK_OBJECTS: usize = 80;

/// Now and then the workload adds many objects in one transaction, or removes them all:
/// the metadata tree grows by several nodes and then holds them nearly empty (removals do
/// not merge nodes), so checkpoints write it afresh — and crashes hit those rewrites too.
fn bulk_txn(present: bool) -> Transaction {
    let mut t = Transaction::new();
    for k in 0..BULK_OBJECTS {
        let oid = format!("bulk-{k:03}");
        if present {
            t.remove(BULK, &oid);
        } else {
            t.touch(BULK, &oid)
                .setattr(BULK, &oid, "v", bytes::Bytes::from(vec![k as u8; 300]));
        }
    }
    t
}

/// Every mount leaves the reserve free: each one takes a journal segment and often a
/// metadata one, and crash after crash with little written between, a store that did not
/// clean back to the reserve at mount ran out of room for the next mount's own checkpoint.
fn assert_reserve_kept<D: carmine_nativestore::BlockDevice>(store: &NativeStore<D>, at: u64) {
    let (free, _) = store.segments_free();
    let reserved = store.segments_reserved();
    assert!(
        free as u64 >= reserved,
        "iteration {at}: a mount left {free} free segments, below the {reserved} reserved"
    );
}

#[test]
fn recovery_after_random_crashes_matches_the_model() {
    let seed = seed();
    let (mut rng, mut runner) = seeded(seed);
    let strategy = arb_transaction();

    let dev = SimDevice::new(DEVICE);
    let model = ModelStore::new();
    block_on(async {
        mkfs(&dev, 1, SEGMENT).await.unwrap();
        let store = NativeStore::mount(dev.clone(), 0, config()).await.unwrap();
        store.submit(setup_txn()).await.unwrap();
        model.submit(setup_txn()).await.unwrap();
    });
    let mut image = dev.image();
    let (mut acked_total, mut lost_total, mut crashes_in_mount) = (0u64, 0u64, 0u64);
    let mut dropped_total = 0u64;
    let mut body_reads_total = 0u64;
    let mut cleaned_total = 0u64;
    let mut cleaned_background_total = 0u64;
    let mut rewrites_total = 0u64;
    for iteration in 0..iterations() {
        let dev = SimDevice::from_image(std::mem::take(&mut image));
        dev.die_at_write(rng.random_range(0..60));
        let mounted = block_on(NativeStore::mount(dev.clone(), 0, config()));
        let store = match mounted {
            Ok(s) => s,
            Err(e) => {
                assert!(dev.is_dead(), "mount failed on a healthy device: {e}");
                crashes_in_mount += 1;
                image = dev.crash(&mut rng).0;
                continue;
            }
        };
        assert_reserve_kept(&store, iteration);
        // The state after mount is what the model says: checked on the recovered image below.
        // Faults besides device death: now and then one fdatasync fails (the device lives
        // on), and now and then a submitter is cancelled after its first poll.
        if rng.random_range(0..4) == 0 {
            dev.fail_sync_at(rng.random_range(0..20));
        }
        // Half the iterations run the shard's committer task, as the OSD does; the others
        // let submitters write the journal themselves, as offline tools do.
        let with_committer = rng.random_bool(0.5);
        let mut in_doubt: Vec<(Transaction, Said)> = Vec::new();
        let workload = async {
            while !dev.is_dead() && !failed(&store) {
                if rng.random_range(0..5) == 0 {
                    let t = strategy.new_tree(&mut runner).unwrap().current();
                    let applied_before = store.stats().transactions;
                    let mut f = Box::pin(store.submit(t.clone()));
                    let waker = futures::task::noop_waker();
                    let polled = f.as_mut().poll(&mut std::task::Context::from_waker(&waker));
                    drop(f);
                    dropped_total += 1;
                    match polled {
                        // Done at once (refused, say): judge it like any other.
                        std::task::Poll::Ready(r) => judge(&model, &mut in_doubt, t, r, "").await,
                        // Cancelled: if it reached the journal queue it will be written
                        // with whatever comes next, in order, though nobody hears of it.
                        std::task::Poll::Pending => {
                            if store.stats().transactions > applied_before {
                                in_doubt.push((t, Said::Queued));
                            }
                        }
                    }
                    continue;
                }
                if rng.random_range(0..25) == 0 {
                    // Removes them when the store has them, else adds them.
                    let present = store.stat(BULK, "bulk-000").await.is_ok();
                    let t = bulk_txn(present);
                    let r = store.submit(t.clone()).await;
                    if r.is_ok() {
                        acked_total += 1;
                    }
                    judge(&model, &mut in_doubt, t, r, "").await;
                    continue;
                }
                let group: Vec<Transaction> = (0..rng.random_range(1..8))
                    .map(|_| strategy.new_tree(&mut runner).unwrap().current())
                    .collect();
                let results = join_all(group.iter().map(|t| store.submit(t.clone()))).await;
                let errs: Vec<String> = results
                    .iter()
                    .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
                    .collect();
                let errs = format!("{errs:?}");
                for (t, r) in group.into_iter().zip(results) {
                    if r.is_ok() {
                        acked_total += 1;
                    }
                    judge(&model, &mut in_doubt, t, r, &errs).await;
                }
            }
        };
        if with_committer {
            let background = std::pin::pin!(store.background());
            let workload = std::pin::pin!(workload);
            // The shard's task ends when the shard fails; the submitters still get answers.
            if let futures::future::Either::Left((_, rest)) =
                block_on(futures::future::select(background, workload))
            {
                block_on(rest);
            }
        } else {
            block_on(workload);
        }
        cleaned_total += store.stats().segments_cleaned;
        cleaned_background_total += store.stats().segments_cleaned_background;
        rewrites_total += store.stats().tree_rewrites;
        drop(store);
        let crashed = dev.crash(&mut rng).0;
        let check = SimDevice::from_image(crashed.clone());
        let store = block_on(NativeStore::mount(check.clone(), 0, config()))
            .unwrap_or_else(|e| panic!("iteration {iteration}: recovery mount failed: {e}"));
        assert_reserve_kept(&store, iteration);
        let got = block_on(dump(&store));
        // Acknowledged transactions must all be there; in-doubt ones as a prefix of wholes.
        let mut matched = diff(&got, &block_on(dump(&model))).is_none();
        let mut applied = 0;
        for (t, _) in &in_doubt {
            if matched {
                break;
            }
            let _ = block_on(model.submit(t.clone()));
            applied += 1;
            matched = diff(&got, &block_on(dump(&model))).is_none();
        }
        assert!(
            matched,
            "iteration {iteration} (CARMINE_SEED={seed}): recovered state is not the \
             acknowledged one plus a prefix of the {} in flight: {}",
            in_doubt.len(),
            diff(&got, &block_on(dump(&model))).unwrap_or_default()
        );
        lost_total += (in_doubt.len() - applied) as u64;
        if iteration % 50 == 0 {
            let report = block_on(fsck(SimDevice::from_image(check.image()), 0)).unwrap();
            assert!(report.errors.is_empty(), "fsck: {:?}", report.errors);
        }
        body_reads_total += store.stats().body_reads;
        drop(store);
        image = check.image();
    }
    eprintln!(
        "{} crash points ({crashes_in_mount} during mount), {acked_total} acknowledged \
         transactions all recovered, {lost_total} in-flight ones lost as wholes, \
         {dropped_total} submitters cancelled mid-way, {body_reads_total} object bodies read \
         back from the tree, {cleaned_total} segments cleaned before a crash \
         ({cleaned_background_total} by the background task), {rewrites_total} metadata \
         trees written afresh",
        iterations()
    );
    assert!(
        body_reads_total > 0,
        "no object body was ever paged out and read back"
    );
    assert!(cleaned_total > 0, "the cleaner never ran before a crash");
    assert!(
        rewrites_total > 0,
        "no checkpoint wrote the metadata tree afresh before a crash"
    );
    assert!(
        cleaned_background_total > 0,
        "the background cleaner (which reads without the apply lock) never ran before a crash"
    );
}

/// What a store holds against what it should: `Ok(corrupt reads)` if every listing, size,
/// xattr and omap entry equals `want`'s and every read returns its data or a checksum error;
/// `Err` names the first difference. An object named [`SENTINEL`] may be there or not.
async fn compare_allowing_corrupt_reads<S: ObjectStore>(
    store: &S,
    want: &carmine_store::conformance::StoreDump,
) -> Result<u64, String> {
    let cids = store.list_collections().await.map_err(|e| e.to_string())?;
    let want_cids: Vec<_> = want.collections.keys().copied().collect();
    if cids != want_cids {
        return Err(format!("collections {cids:?}, want {want_cids:?}"));
    }
    let mut corrupt = 0;
    for (cid, objects) in &want.collections {
        let page = store
            .list_objects(*cid, None, 1 << 20)
            .await
            .map_err(|e| e.to_string())?;
        let names: Vec<&String> = page.items.iter().filter(|n| *n != SENTINEL).collect();
        let want_names: Vec<&String> = objects.keys().collect();
        if names != want_names {
            return Err(format!("{cid}: objects {names:?}, want {want_names:?}"));
        }
        for (oid, o) in objects {
            let what = format!("{cid}/{oid}");
            let size = store.stat(*cid, oid).await.map_err(|e| e.to_string())?.size;
            if size != o.size {
                return Err(format!("{what}: size {size}, want {}", o.size));
            }
            // Block by block, so one bad block does not hide the others.
            let mut off = 0;
            while off < size {
                let len = (size - off).min(4096 - off % 4096);
                match store.read(*cid, oid, off, len).await {
                    Ok(b) if b[..] == o.data[off as usize..(off + len) as usize] => {}
                    Ok(_) => return Err(format!("{what}: wrong data at {off}")),
                    Err(e) if e.kind == StoreErrorKind::Corrupt => corrupt += 1,
                    Err(e) => return Err(format!("{what}: read at {off}: {e}")),
                }
                off += len;
            }
            let attrs = store.getattrs(*cid, oid).await.map_err(|e| e.to_string())?;
            let header = store
                .omap_get_header(*cid, oid)
                .await
                .map_err(|e| e.to_string())?;
            let omap = store
                .omap_iterate(*cid, oid, None, 1 << 20)
                .await
                .map_err(|e| e.to_string())?;
            let omap: std::collections::BTreeMap<_, _> = omap.items.into_iter().collect();
            if attrs != o.attrs || header != o.omap_header || omap != o.omap {
                return Err(format!("{what}: xattrs or omap differ"));
            }
        }
    }
    Ok(corrupt)
}

/// Written last, so that the record carrying the workload's last acknowledged transaction
/// has a later record vouching for it: the newest record of a journal cannot be told apart
/// from a write torn by a crash, so a flip in it may cost it (the sentinel) and nothing else.
const SENTINEL: &str = "~sentinel";

/// A bit flipped anywhere a store has written — superblock, checkpoint slots and blobs,
/// journal record headers, deltas, data blocks — after everything was acknowledged: mount
/// refuses with an error, or the store holds exactly what was acknowledged, where a read of a
/// damaged data block fails its checksum and returns no data. Never a different state.
#[test]
fn a_flipped_bit_in_what_the_store_wrote_is_refused_or_reported_never_a_different_state() {
    let seed = seed();
    let (mut rng, mut runner) = seeded(seed);
    let strategy = arb_transaction();
    let dev = SimDevice::new(DEVICE);
    let model = ModelStore::new();
    // A few mounts, each with some acknowledged groups: checkpoints, several journal
    // segments and cleaned ones end up on the image.
    block_on(async {
        mkfs(&dev, 1, SEGMENT).await.unwrap();
        // The last round takes no checkpoint: its records are all in the live journal,
        // which a mount must replay.
        for round in 0..5 {
            let config = match round {
                4 => NativeConfig {
                    checkpoint_interval_blocks: 1 << 30,
                    ..config()
                },
                _ => config(),
            };
            let store = NativeStore::mount(dev.clone(), 0, config).await.unwrap();
            if round == 0 {
                store.submit(setup_txn()).await.unwrap();
                model.submit(setup_txn()).await.unwrap();
            }
            for _ in 0..40 {
                let group: Vec<Transaction> = (0..rng.random_range(1..6))
                    .map(|_| strategy.new_tree(&mut runner).unwrap().current())
                    .collect();
                let results = join_all(group.iter().map(|t| store.submit(t.clone()))).await;
                for (t, r) in group.into_iter().zip(results) {
                    let m = model.submit(t).await;
                    assert_eq!(r.is_ok(), m.is_ok(), "store {r:?}, model {m:?}");
                }
            }
            if round == 4 {
                let mut t = Transaction::new();
                t.touch(PgId { pool: 1, seed: 0 }, SENTINEL);
                store.submit(t).await.unwrap();
            }
        }
    });
    let want = block_on(dump(&model));
    let clean = dev.image();
    // Only blocks something was written to: a flip in never-written space proves nothing.
    let written: Vec<usize> = clean
        .chunks(4096)
        .enumerate()
        .filter(|(_, b)| b.iter().any(|&x| x != 0))
        .map(|(i, _)| i)
        .collect();
    // docs/format/native-store.md: the superblock (block 0) and its backup (the first MiB's
    // last block); the shard at 1 MiB: slots A and B, then segments, each with its header.
    let shard = (1 << 20) / 4096;
    let segment_blocks = SEGMENT as usize / 4096;
    let headers: Vec<usize> = written
        .iter()
        .copied()
        .filter(|&b| {
            b == 0
                || b == shard - 1
                || b == shard
                || b == shard + 1
                || (b >= shard + 2 && (b - shard - 2) % segment_blocks == 0)
        })
        .collect();
    let trials: u64 = std::env::var("CARMINE_FLIP_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 200 } else { 2000 });
    let (mut refused, mut same, mut reported) = (0u64, 0u64, 0u64);
    for trial in 0..trials {
        // Headers sit at the start of blocks (records, checkpoint slots, segment headers):
        // two thirds of the flips land in a block's first 64 bytes, half of those in a
        // segment's first block (or the superblock's).
        let block = match rng.random_range(0..3) {
            0 => headers[rng.random_range(0..headers.len())],
            _ => written[rng.random_range(0..written.len())],
        };
        let within = if rng.random_bool(0.33) {
            rng.random_range(0..4096)
        } else {
            rng.random_range(0..64)
        };
        let byte = block * 4096 + within;
        let bit = rng.random_range(0..8u8);
        let flipped = SimDevice::from_image(clean.clone());
        flipped.flip_bit(byte as u64, bit);
        let store = match block_on(NativeStore::mount(flipped.clone(), 0, config())) {
            Ok(s) => s,
            Err(_) => {
                refused += 1;
                continue;
            }
        };
        match block_on(compare_allowing_corrupt_reads(&store, &want)) {
            Ok(0) => same += 1,
            Ok(_) => reported += 1,
            Err(why) => {
                // Every record header on the clean image: sequence, durable mark, blocks.
                let recs: Vec<String> = written
                    .iter()
                    .filter(|&&b| &clean[b * 4096..b * 4096 + 4] == b"CREC")
                    .map(|&b| {
                        let h = &clean[b * 4096..b * 4096 + 64];
                        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
                        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
                        format!("b{b}:seq{}:mark{}:n{}", u64_at(8), u64_at(40), u32_at(32))
                    })
                    .collect();
                panic!(
                    "trial {trial} (CARMINE_SEED={seed}): bit {bit} of byte {byte} (block \
                     {block}) flipped, the store mounted with another state: {why}\n{recs:?}"
                )
            }
        }
    }
    eprintln!(
        "{trials} flips over {} written blocks ({} headers): {refused} refused at mount, \
         {same} harmless, {reported} reported as corrupt reads",
        written.len(),
        headers.len()
    );
    assert!(
        refused > 0 && same + reported > 0,
        "the flips reached nothing that matters"
    );
}
