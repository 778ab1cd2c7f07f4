//! White-box tests of the memory store: accounting and page sharing, which the trait-level
//! conformance suite cannot see.

use super::data::PAGE_SIZE;
use super::*;
use crate::conformance::{arb_step, seed_from_env, Step};
use carmine_types::limits::OBJECT_SIZE_MAX;
use carmine_types::PgId;
use futures::executor::block_on;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::rc::Rc;

const C: CollectionId = carmine_types::PgId { pool: 1, seed: 0 };

fn store() -> MemStore {
    let s = MemStore::new(MemStoreConfig::default());
    block_on(s.submit(Transaction {
        ops: vec![Op::CreateCollection { cid: C }],
    }))
    .unwrap();
    s
}

fn submit(s: &MemStore, t: &mut Transaction) -> Result<()> {
    block_on(s.submit(std::mem::take(t)))
}

fn assert_recount(s: &MemStore, what: &str) {
    let inner = s.inner.borrow();
    assert_eq!(
        inner.recount(),
        (inner.used, inner.objects),
        "accounting drifted after {what}"
    );
}

#[test]
fn accounting_matches_a_recount_after_random_transactions() {
    let seed = seed_from_env();
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    for case in 0..40 {
        let s = store();
        block_on(s.submit(Transaction {
            ops: vec![Op::CreateCollection {
                cid: PgId { pool: 1, seed: 1 },
            }],
        }))
        .unwrap();
        let steps = proptest::collection::vec(arb_step(), 40)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        for (i, step) in steps.into_iter().enumerate() {
            if let Step::Submit(txn) = step {
                let ok = block_on(s.submit(txn)).is_ok();
                assert_recount(
                    &s,
                    &format!("case {case} step {i} (ok: {ok}), CARMINE_SEED={seed}"),
                );
            }
        }
    }
}

fn object<R>(s: &MemStore, oid: &str, f: impl FnOnce(&Object) -> R) -> R {
    f(&s.inner.borrow().colls[&C][oid])
}

#[test]
fn clone_shares_pages_until_one_side_writes() {
    let s = store();
    let mut t = Transaction::new();
    t.write(C, "src", 0, Bytes::from(vec![1; 64 * PAGE_SIZE]))
        .clone_object(C, "src", "dst");
    submit(&s, &mut t).unwrap();
    t.write(
        C,
        "dst",
        5 * PAGE_SIZE as u64,
        Bytes::from(vec![2; PAGE_SIZE]),
    );
    submit(&s, &mut t).unwrap();
    let src = object(&s, "src", |o| o.data.snapshot(0, 64 * PAGE_SIZE as u64));
    let dst = object(&s, "dst", |o| o.data.snapshot(0, 64 * PAGE_SIZE as u64));
    let shared = (0..64u64)
        .filter(|&i| Rc::ptr_eq(&src.page(i), &dst.page(i)))
        .count();
    assert_eq!(shared, 63, "only the written page is unshared");
    assert_recount(&s, "clone and write");
}

#[test]
fn zeroed_truncated_and_removed_data_is_uncharged() {
    let s = store();
    let base = s.statfs().bytes_used;
    let mut t = Transaction::new();
    t.write(C, "o", 0, Bytes::from(vec![1; 10 * PAGE_SIZE]));
    submit(&s, &mut t).unwrap();
    let page = PAGE_SIZE as u64;
    let full = s.statfs().bytes_used;
    assert_eq!(full - base, fixed_charge("o") + 10 * page);
    t.zero(C, "o", page, 2 * page);
    submit(&s, &mut t).unwrap();
    assert_eq!(s.statfs().bytes_used, full - 2 * page);
    t.truncate(C, "o", 5 * page + 1);
    submit(&s, &mut t).unwrap();
    assert_eq!(
        s.statfs().bytes_used,
        full - 6 * page,
        "pages 0, 3, 4 and the partial 5 remain"
    );
    t.remove(C, "o");
    submit(&s, &mut t).unwrap();
    assert_eq!(s.statfs().bytes_used, base);
    assert_recount(&s, "removal");
}

#[test]
fn sparse_write_near_the_size_limit_charges_one_page() {
    let s = store();
    let mut t = Transaction::new();
    t.write(
        C,
        "o",
        OBJECT_SIZE_MAX - 10,
        Bytes::from_static(b"0123456789"),
    );
    submit(&s, &mut t).unwrap();
    assert_eq!(
        s.statfs().bytes_used,
        fixed_charge("o") + PAGE_SIZE as u64,
        "the limit is page aligned"
    );
    assert_eq!(
        block_on(s.read(C, "o", OBJECT_SIZE_MAX - 12, 0)).unwrap(),
        &b"\0\x000123456789"[..]
    );
    assert_recount(&s, "sparse write");
}

#[test]
fn metadata_is_charged_by_its_bytes() {
    let s = store();
    let mut t = Transaction::new();
    t.touch(C, "o");
    submit(&s, &mut t).unwrap();
    let base = s.statfs().bytes_used;
    t.setattr(C, "o", "name", Bytes::from_static(b"value"))
        .omap_set(
            C,
            "o",
            vec![(Bytes::from_static(b"key"), Bytes::from_static(b"v"))],
        )
        .omap_set_header(C, "o", Bytes::from_static(b"hh"));
    submit(&s, &mut t).unwrap();
    assert_eq!(s.statfs().bytes_used - base, 9 + 4 + 2);
    t.omap_clear(C, "o").rmattr(C, "o", "name");
    submit(&s, &mut t).unwrap();
    assert_eq!(s.statfs().bytes_used, base);
}
