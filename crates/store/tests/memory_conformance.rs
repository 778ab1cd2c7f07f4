//! The memory store against the shared conformance suite, plus what only it has: the memory
//! budget, and objects at the far end of the size limit (the dense model cannot hold those).

use bytes::Bytes;
use carmine_store::conformance::{
    check_random_transactions_against_model, diff, dump, seed_from_env,
};
use carmine_store::{MemStore, MemStoreConfig, ObjectStore, StoreErrorKind, Transaction};
use carmine_types::limits::OBJECT_SIZE_MAX;
use carmine_types::{CollectionId, PgId};
use futures::executor::block_on;

carmine_store::conformance_tests!(
    make_store: MemStore::new(MemStoreConfig::default()),
    block_on: futures::executor::block_on,
);

const C: CollectionId = PgId { pool: 1, seed: 0 };
const PAGE: usize = 4096;

/// A store with room for about `pages` pages of data, holding collection `C`.
fn small_store(pages: u64) -> MemStore {
    let store = MemStore::new(MemStoreConfig {
        memory_limit_bytes: pages * PAGE as u64,
    });
    let mut t = Transaction::new();
    t.create_collection(C);
    block_on(store.submit(t)).unwrap();
    store
}

fn pages(n: usize, byte: u8) -> Bytes {
    Bytes::from(vec![byte; n * PAGE])
}

fn submit(
    store: &MemStore,
    build: impl FnOnce(&mut Transaction) -> &mut Transaction,
) -> Result<(), StoreErrorKind> {
    let mut t = Transaction::new();
    build(&mut t);
    block_on(store.submit(t)).map_err(|e| e.kind)
}

#[test]
fn no_space_is_returned_and_the_store_is_unchanged() {
    let store = small_store(20);
    submit(&store, |t| {
        t.write(C, "a", 0, pages(12, 1))
            .setattr(C, "a", "x", Bytes::from_static(b"1"))
    })
    .unwrap();
    let before = block_on(dump(&store));
    let statfs = store.statfs();
    let result = submit(&store, |t| {
        t.touch(C, "b")
            .write(C, "a", 0, pages(1, 9))
            .write(C, "b", 0, pages(10, 2))
            .touch(C, "c")
    });
    assert_eq!(result, Err(StoreErrorKind::NoSpace));
    assert_eq!(diff(&block_on(dump(&store)), &before), None);
    assert_eq!(store.statfs(), statfs);
}

#[test]
fn deletes_and_truncates_work_when_full_and_free_space() {
    let store = small_store(20);
    let mut n = 0;
    while submit(&store, |t| t.write(C, &format!("o{n}"), 0, pages(3, 1))).is_ok() {
        n += 1;
    }
    assert!(n >= 5, "only {n} objects fit");
    let full = store.statfs().bytes_used;
    assert_eq!(
        submit(&store, |t| t.write(C, "o0", 3 * PAGE as u64, pages(3, 1))),
        Err(StoreErrorKind::NoSpace)
    );
    // Shrinking ops never need budget, even on a full store.
    submit(&store, |t| {
        t.truncate(C, "o0", 100).zero(C, "o1", 0, 2 * PAGE as u64)
    })
    .unwrap();
    assert!(store.statfs().bytes_used < full);
    submit(&store, |t| t.remove(C, "o2").remove(C, "o3")).unwrap();
    assert!(store.statfs().bytes_used < full - 5 * PAGE as u64);
    submit(&store, |t| t.write(C, "o0", 3 * PAGE as u64, pages(3, 1))).expect("space was freed");
}

#[test]
fn a_transaction_may_use_space_it_frees_first() {
    let store = small_store(20);
    submit(&store, |t| t.write(C, "old", 0, pages(15, 1))).unwrap();
    assert_eq!(
        submit(&store, |t| t
            .write(C, "new", 0, pages(10, 2))
            .remove(C, "old")),
        Err(StoreErrorKind::NoSpace)
    );
    submit(&store, |t| {
        t.remove(C, "old").write(C, "new", 0, pages(10, 2))
    })
    .unwrap();
}

#[test]
fn statfs_reports_limit_usage_and_objects() {
    let store = small_store(100);
    let empty = store.statfs();
    assert_eq!(
        (empty.bytes_total, empty.bytes_used, empty.objects),
        (100 * PAGE as u64, 0, 0)
    );
    submit(&store, |t| t.write(C, "a", 0, pages(2, 1)).touch(C, "b")).unwrap();
    let s = store.statfs();
    assert_eq!(s.objects, 2);
    assert!(
        s.bytes_used >= 2 * PAGE as u64 && s.bytes_used < 3 * PAGE as u64,
        "{s:?}"
    );
    assert_eq!(
        MemStore::new(MemStoreConfig::default())
            .statfs()
            .bytes_total,
        1 << 30
    );
}

#[test]
fn failing_op_mid_transaction_leaves_earlier_ops_unapplied() {
    let store = small_store(100);
    submit(&store, |t| t.write(C, "a", 0, pages(1, 1))).unwrap();
    let before = block_on(dump(&store));
    let statfs = store.statfs();
    let other = PgId { pool: 1, seed: 1 };
    let result = submit(&store, |t| {
        t.write(C, "a", 10, pages(2, 7))
            .setattr(C, "a", "x", Bytes::from_static(b"1"))
            .create_collection(other)
            .write(other, "b", 0, pages(1, 2))
            .remove(C, "a")
            .remove(C, "a") // fails: already removed by the op before
            .touch(C, "later")
    });
    assert_eq!(result, Err(StoreErrorKind::ObjectNotFound));
    assert_eq!(diff(&block_on(dump(&store)), &before), None);
    assert_eq!(store.statfs(), statfs);
    assert!(!block_on(store.collection_exists(other)).unwrap());
    assert_eq!(block_on(store.read(C, "a", 0, 0)).unwrap(), pages(1, 1));
}

#[test]
fn write_ending_at_the_size_limit_is_accepted_and_sparse() {
    let store = small_store(10);
    submit(&store, |t| {
        t.write(C, "far", OBJECT_SIZE_MAX - 3, Bytes::from_static(b"end"))
    })
    .unwrap();
    assert_eq!(
        block_on(store.stat(C, "far")).unwrap().size,
        OBJECT_SIZE_MAX
    );
    assert_eq!(
        block_on(store.read(C, "far", OBJECT_SIZE_MAX - 5, 0)).unwrap(),
        &b"\0\0end"[..]
    );
    assert_eq!(
        block_on(store.read(C, "far", 1 << 39, 3)).unwrap(),
        &[0u8; 3][..]
    );
    assert!(
        store.statfs().bytes_used < 2 * PAGE as u64,
        "a 1 TiB sparse object costs one page"
    );
    submit(&store, |t| {
        t.truncate(C, "far", OBJECT_SIZE_MAX)
            .zero(C, "far", 0, OBJECT_SIZE_MAX)
    })
    .unwrap();
    assert!(
        store.statfs().bytes_used < PAGE as u64,
        "zeroing 1 TiB visits only allocated pages"
    );
}

#[test]
fn long_seeded_run_matches_the_model() {
    let store = MemStore::new(MemStoreConfig::default());
    block_on(check_random_transactions_against_model(
        &store,
        seed_from_env(),
        600,
    ));
}
