//! The hand-written conformance cases, grouped by topic. Each takes an empty store and panics
//! on a violation. Keep the `pub async fn name<S: ObjectStore>` shape at the start of a line:
//! a unit test finds cases by it to check that every one is wired into the macro.

mod clones;
mod collections;
mod compares;
mod data;
mod metadata;
mod transactions;

pub use clones::*;
pub use collections::*;
pub use compares::*;
pub use data::*;
pub use metadata::*;
pub use transactions::*;

use super::{diff, dump, dump_object};
use crate::{ObjectStore, StoreError, StoreErrorKind, Transaction};
use bytes::Bytes;
use carmine_types::{CollectionId, PgId};

/// Source files of the cases, for the wiring check.
#[cfg(test)]
pub(super) const SOURCES: [&str; 6] = [
    include_str!("cases/clones.rs"),
    include_str!("cases/compares.rs"),
    include_str!("cases/collections.rs"),
    include_str!("cases/data.rs"),
    include_str!("cases/metadata.rs"),
    include_str!("cases/transactions.rs"),
];

/// The collection most cases work in.
const C: CollectionId = PgId { pool: 3, seed: 0 };
/// A collection no case creates.
const MISSING: CollectionId = PgId { pool: 9, seed: 9 };

/// Builds a transaction in place; lets a case state its ops on one line each.
type Build = fn(&mut Transaction) -> &mut Transaction;

/// Distinctive bytes that are never zero, so they cannot be mistaken for a hole.
fn pattern(len: usize, salt: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) | 1)
        .collect()
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn kind<T>(r: Result<T, StoreError>) -> Option<StoreErrorKind> {
    r.err().map(|e| e.kind)
}

fn build(f: impl FnOnce(&mut Transaction) -> &mut Transaction) -> Transaction {
    let mut t = Transaction::new();
    f(&mut t);
    t
}

/// Submits the transaction `f` builds; it must succeed.
async fn apply<S: ObjectStore>(store: &S, f: impl FnOnce(&mut Transaction) -> &mut Transaction) {
    let t = build(f);
    let n = t.ops.len();
    if let Err(e) = store.submit(t).await {
        panic!("transaction of {n} ops failed: {e}");
    }
}

/// Submits the transaction `f` builds; it must fail with `expected`.
async fn fails<S: ObjectStore>(
    store: &S,
    expected: StoreErrorKind,
    f: impl FnOnce(&mut Transaction) -> &mut Transaction,
) {
    let t = build(f);
    let ops = format!("{:?}", t.ops);
    let ops = ops.get(..200).unwrap_or(&ops);
    assert_eq!(kind(store.submit(t).await), Some(expected), "ops: {ops}");
}

/// Creates `C`.
async fn setup<S: ObjectStore>(store: &S) {
    apply(store, |t| t.create_collection(C)).await;
}

async fn write<S: ObjectStore>(store: &S, oid: &str, off: u64, data: &Bytes) {
    apply(store, |t| t.write(C, oid, off, data.clone())).await;
}

async fn read_all<S: ObjectStore>(store: &S, oid: &str) -> Vec<u8> {
    store.read(C, oid, 0, 0).await.unwrap().to_vec()
}

async fn size<S: ObjectStore>(store: &S, oid: &str) -> u64 {
    store.stat(C, oid).await.unwrap().size
}

async fn exists<S: ObjectStore>(store: &S, oid: &str) -> bool {
    match store.stat(C, oid).await {
        Ok(_) => true,
        Err(e) if e.kind == StoreErrorKind::ObjectNotFound => false,
        Err(e) => panic!("stat {oid}: {e}"),
    }
}

/// `base` with `patch` laid over it at `off`, zero-extended as needed.
fn overlay(base: &[u8], off: usize, patch: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    if v.len() < off + patch.len() {
        v.resize(off + patch.len(), 0);
    }
    v[off..off + patch.len()].copy_from_slice(patch);
    v
}

/// An object with something in every part: data with a hole, xattrs, omap, header.
async fn full_object<S: ObjectStore>(store: &S, oid: &str) {
    apply(store, |t| {
        t.write(C, oid, 0, pattern(10_000, 1))
            .write(C, oid, 20_000, pattern(4096, 2))
            .setattr(C, oid, "a", b("1"))
            .setattr(C, oid, "b", b("2"))
            .omap_set(C, oid, vec![(b("k"), b("v"))])
            .omap_set_header(C, oid, b("hdr"))
    })
    .await;
}
