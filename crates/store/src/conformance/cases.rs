//! The hand-written conformance cases. Each takes an empty store and panics on a violation.
//! Keep the `pub async fn name<S: ObjectStore>` shape: a unit test finds cases by it.

use super::{diff, dump, dump_object};
use crate::{ObjectStore, Op, StoreError, StoreErrorKind, Transaction};
use bytes::Bytes;
use carmine_types::limits::{
    ATTR_NAME_LEN_MAX, IO_LEN_MAX, OBJECT_NAME_LEN_MAX, OBJECT_SIZE_MAX, VALUE_LEN_MAX,
};
use carmine_types::{CollectionId, PgId};
use std::collections::BTreeMap;
use StoreErrorKind::*;

/// The collection most cases work in.
const C: CollectionId = PgId { pool: 3, seed: 0 };
/// A collection no case creates.
const MISSING: CollectionId = PgId { pool: 9, seed: 9 };

/// Distinctive bytes that are never zero, so they cannot be mistaken for a hole.
fn pattern(len: usize, salt: u8) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) | 1).collect()
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn kind<T>(r: Result<T, StoreError>) -> Option<StoreErrorKind> {
    r.err().map(|e| e.kind)
}

fn one(op: Op) -> Transaction {
    Transaction { ops: vec![op] }
}

async fn submit<S: ObjectStore>(store: &S, txn: Transaction) {
    if let Err(e) = store.submit(txn.clone()).await {
        panic!("transaction of {} ops failed: {e}", txn.ops.len());
    }
}

async fn fails<S: ObjectStore>(store: &S, txn: Transaction, expected: StoreErrorKind) {
    assert_eq!(kind(store.submit(txn).await), Some(expected));
}

/// Creates `C` and returns it.
async fn setup<S: ObjectStore>(store: &S) -> CollectionId {
    submit(store, one(Op::CreateCollection { cid: C })).await;
    C
}

async fn write<S: ObjectStore>(store: &S, oid: &str, off: u64, data: &Bytes) {
    submit(store, one(Op::Write { cid: C, oid: oid.into(), off, data: data.clone() })).await;
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
        Err(e) if e.kind == ObjectNotFound => false,
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

pub async fn write_then_read_returns_same_bytes<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(10_000, 1);
    write(store, "obj", 0, &data).await;
    assert_eq!(store.read(C, "obj", 0, 10_000).await.unwrap(), data);
    assert_eq!(store.read(C, "obj", 0, 0).await.unwrap(), data);
    let page = pattern(4096, 2);
    write(store, "aligned", 8192, &page).await;
    assert_eq!(store.read(C, "aligned", 8192, 4096).await.unwrap(), page);
}

pub async fn unaligned_writes_across_pages_read_back<S: ObjectStore>(store: &S) {
    setup(store).await;
    let mut expected = Vec::new();
    for (off, len, salt) in [(4000, 5000, 1), (4095, 1, 2), (4096, 1, 3), (12_000, 300, 4), (1, 8190, 5)] {
        let data = pattern(len, salt);
        write(store, "obj", off as u64, &data).await;
        expected = overlay(&expected, off, &data);
    }
    assert_eq!(read_all(store, "obj").await, expected);
    assert_eq!(store.read(C, "obj", 4000, 5000).await.unwrap(), expected[4000..9000]);
}

pub async fn overwrite_changes_only_the_written_range<S: ObjectStore>(store: &S) {
    setup(store).await;
    let base = pattern(12_288, 1);
    write(store, "obj", 0, &base).await;
    let patch = pattern(100, 2);
    write(store, "obj", 4050, &patch).await;
    assert_eq!(read_all(store, "obj").await, overlay(&base, 4050, &patch));
    assert_eq!(size(store, "obj").await, 12_288);
}

pub async fn holes_read_as_zeros<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(10, 1);
    write(store, "obj", (1 << 20) + 3, &data).await;
    assert_eq!(read_all(store, "obj").await, overlay(&vec![0; (1 << 20) + 3], (1 << 20) + 3, &data));
    assert_eq!(store.read(C, "obj", 500_000, 100).await.unwrap(), vec![0; 100]);
    submit(store, one(Op::Truncate { cid: C, oid: "big".into(), size: 3 << 20 })).await;
    assert_eq!(read_all(store, "big").await, vec![0; 3 << 20]);
}

pub async fn read_len_zero_reads_to_end<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(9000, 1);
    write(store, "obj", 0, &data).await;
    assert_eq!(store.read(C, "obj", 1234, 0).await.unwrap(), data[1234..]);
}

pub async fn read_at_end_of_object_is_short<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(9000, 1);
    write(store, "obj", 0, &data).await;
    assert_eq!(store.read(C, "obj", 8000, 5000).await.unwrap(), data[8000..]);
}

pub async fn read_past_end_returns_empty<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(9000, 1)).await;
    for (off, len) in [(9000, 10), (9000, 0), (9001, 0), (100_000, 5)] {
        assert!(store.read(C, "obj", off, len).await.unwrap().is_empty(), "read({off}, {len})");
    }
    submit(store, one(Op::Touch { cid: C, oid: "empty".into() })).await;
    assert!(store.read(C, "empty", 0, 0).await.unwrap().is_empty());
}

pub async fn readv_returns_each_extent<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(9000, 1);
    write(store, "obj", 0, &data).await;
    let extents = [(0, 10), (8990, 100), (20_000, 5), (100, 0), (4090, 12)];
    let got = store.readv(C, "obj", &extents).await.unwrap();
    assert_eq!(got.len(), extents.len());
    for (&(off, len), bytes) in extents.iter().zip(&got) {
        assert_eq!(*bytes, store.read(C, "obj", off, len).await.unwrap(), "extent ({off}, {len})");
    }
    assert!(store.readv(C, "obj", &[]).await.unwrap().is_empty());
    assert_eq!(kind(store.readv(C, "nope", &[(0, 1)]).await), Some(ObjectNotFound));
}

pub async fn read_of_missing_object_is_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    assert_eq!(kind(store.read(C, "nope", 0, 0).await), Some(ObjectNotFound));
    assert_eq!(kind(store.stat(C, "nope").await), Some(ObjectNotFound));
    assert_eq!(kind(store.getattr(C, "nope", "a").await), Some(ObjectNotFound));
    assert_eq!(kind(store.getattrs(C, "nope").await), Some(ObjectNotFound));
    assert_eq!(kind(store.omap_get_header(C, "nope").await), Some(ObjectNotFound));
    assert_eq!(kind(store.omap_get_values(C, "nope", &[b("k")]).await), Some(ObjectNotFound));
    assert_eq!(kind(store.omap_iterate(C, "nope", None, 10).await), Some(ObjectNotFound));
}

pub async fn read_in_missing_collection_is_collection_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    assert_eq!(kind(store.read(MISSING, "o", 0, 0).await), Some(CollectionNotFound));
    assert_eq!(kind(store.readv(MISSING, "o", &[(0, 1)]).await), Some(CollectionNotFound));
    assert_eq!(kind(store.stat(MISSING, "o").await), Some(CollectionNotFound));
    assert_eq!(kind(store.getattr(MISSING, "o", "a").await), Some(CollectionNotFound));
    assert_eq!(kind(store.getattrs(MISSING, "o").await), Some(CollectionNotFound));
    assert_eq!(kind(store.omap_get_header(MISSING, "o").await), Some(CollectionNotFound));
    assert_eq!(kind(store.omap_get_values(MISSING, "o", &[]).await), Some(CollectionNotFound));
    assert_eq!(kind(store.omap_iterate(MISSING, "o", None, 10).await), Some(CollectionNotFound));
    assert_eq!(kind(store.list_objects(MISSING, None, 10).await), Some(CollectionNotFound));
    assert!(!store.collection_exists(MISSING).await.unwrap());
}

pub async fn oversized_read_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    let max = IO_LEN_MAX as u64;
    submit(store, one(Op::Truncate { cid: C, oid: "obj".into(), size: max + 4096 })).await;
    assert_eq!(kind(store.read(C, "obj", 0, max + 1).await), Some(InvalidArgument));
    assert_eq!(kind(store.read(C, "obj", 0, 0).await), Some(InvalidArgument), "to end is too long");
    assert_eq!(kind(store.readv(C, "obj", &[(0, 1), (0, max + 1)]).await), Some(InvalidArgument));
    assert_eq!(store.read(C, "obj", 4096, 0).await.unwrap().len() as u64, max);
    assert_eq!(store.read(C, "obj", 0, max).await.unwrap().len() as u64, max);
}

pub async fn stat_reports_highest_written_byte<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 100, &pattern(50, 1)).await;
    assert_eq!(size(store, "obj").await, 150);
    write(store, "obj", 10, &pattern(5, 1)).await;
    assert_eq!(size(store, "obj").await, 150);
    write(store, "obj", 5000, &pattern(1, 1)).await;
    assert_eq!(size(store, "obj").await, 5001);
}

pub async fn empty_write_creates_object_without_growing_it<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 4096, &Bytes::new()).await;
    assert_eq!(size(store, "obj").await, 0);
    write(store, "obj", 0, &pattern(10, 1)).await;
    write(store, "obj", 100, &Bytes::new()).await;
    assert_eq!(size(store, "obj").await, 10);
}

pub async fn touch_creates_empty_object_and_keeps_existing_data<S: ObjectStore>(store: &S) {
    setup(store).await;
    submit(store, one(Op::Touch { cid: C, oid: "new".into() })).await;
    assert_eq!(dump_object(store, C, "new").await, Default::default());
    let mut t = Transaction::new();
    t.write(C, "obj", 0, pattern(5000, 1)).setattr(C, "obj", "a", b("v")).omap_set(C, "obj", vec![(b("k"), b("v"))]);
    submit(store, t).await;
    let before = dump_object(store, C, "obj").await;
    submit(store, one(Op::Touch { cid: C, oid: "obj".into() })).await;
    assert_eq!(dump_object(store, C, "obj").await, before);
}

pub async fn zero_clears_range_and_extends_object<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(10_000, 1);
    write(store, "obj", 0, &data).await;
    submit(store, one(Op::Zero { cid: C, oid: "obj".into(), off: 100, len: 5000 })).await;
    let expected = overlay(&data, 100, &[0; 5000]);
    assert_eq!(read_all(store, "obj").await, expected);
    submit(store, one(Op::Zero { cid: C, oid: "obj".into(), off: 9000, len: 3000 })).await;
    let expected = overlay(&expected, 9000, &[0; 3000]);
    assert_eq!(read_all(store, "obj").await, expected);
    assert_eq!(size(store, "obj").await, 12_000);
    submit(store, one(Op::Zero { cid: C, oid: "obj".into(), off: 50_000, len: 0 })).await;
    assert_eq!(size(store, "obj").await, 12_000, "an empty range does not extend");
}

pub async fn truncate_shrinks_and_zero_fills_on_regrow<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(10_000, 1);
    write(store, "obj", 0, &data).await;
    submit(store, one(Op::Truncate { cid: C, oid: "obj".into(), size: 5000 })).await;
    assert_eq!(read_all(store, "obj").await, data[..5000]);
    submit(store, one(Op::Truncate { cid: C, oid: "obj".into(), size: 10_000 })).await;
    assert_eq!(read_all(store, "obj").await, overlay(&data[..5000], 5000, &[0; 5000]));
    // The same inside one transaction, and growing by a write rather than a truncate.
    let mut t = Transaction::new();
    t.write(C, "two", 0, data.clone()).truncate(C, "two", 4096).write(C, "two", 9999, pattern(1, 2));
    submit(store, t).await;
    assert_eq!(read_all(store, "two").await, overlay(&overlay(&data[..4096], 4096, &[0; 5903]), 9999, &pattern(1, 2)));
}

pub async fn truncate_extends_with_zeros<S: ObjectStore>(store: &S) {
    setup(store).await;
    submit(store, one(Op::Truncate { cid: C, oid: "obj".into(), size: 7000 })).await;
    assert_eq!(read_all(store, "obj").await, vec![0; 7000]);
    submit(store, one(Op::Truncate { cid: C, oid: "obj".into(), size: 0 })).await;
    assert_eq!(size(store, "obj").await, 0);
}

pub async fn setters_create_missing_objects<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "src", 0, &pattern(10, 1)).await;
    let cid = C;
    let ops = [
        Op::Touch { cid, oid: "touch".into() },
        Op::Write { cid, oid: "write".into(), off: 0, data: b("x") },
        Op::Zero { cid, oid: "zero".into(), off: 0, len: 10 },
        Op::Truncate { cid, oid: "truncate".into(), size: 10 },
        Op::SetAttrs { cid, oid: "setattrs".into(), attrs: vec![] },
        Op::OmapSetKeys { cid, oid: "omap".into(), kvs: vec![] },
        Op::OmapSetHeader { cid, oid: "header".into(), header: b("h") },
        Op::CloneRange { cid, src: "src".into(), dst: "range".into(), src_off: 0, len: 5, dst_off: 0 },
    ];
    for op in ops {
        let (Op::Touch { oid, .. }
        | Op::Write { oid, .. }
        | Op::Zero { oid, .. }
        | Op::Truncate { oid, .. }
        | Op::SetAttrs { oid, .. }
        | Op::OmapSetKeys { oid, .. }
        | Op::OmapSetHeader { oid, .. }
        | Op::CloneRange { dst: oid, .. }) = op.clone()
        else {
            unreachable!()
        };
        submit(store, one(op)).await;
        assert!(exists(store, &oid).await, "{oid} was not created");
    }
}

pub async fn remove_deletes_object_and_all_its_metadata<S: ObjectStore>(store: &S) {
    setup(store).await;
    let mut t = Transaction::new();
    t.write(C, "obj", 0, pattern(5000, 1))
        .setattr(C, "obj", "a", b("v"))
        .omap_set(C, "obj", vec![(b("k"), b("v"))])
        .omap_set_header(C, "obj", b("h"));
    submit(store, t).await;
    submit(store, one(Op::Remove { cid: C, oid: "obj".into() })).await;
    assert!(!exists(store, "obj").await);
    assert!(store.list_objects(C, None, 10).await.unwrap().items.is_empty());
    submit(store, one(Op::Touch { cid: C, oid: "obj".into() })).await;
    assert_eq!(dump_object(store, C, "obj").await, Default::default(), "recreated object is fresh");
}

pub async fn remove_of_missing_object_is_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    fails(store, one(Op::Remove { cid: C, oid: "nope".into() }), ObjectNotFound).await;
}

pub async fn setattrs_and_getattr_round_trip<S: ObjectStore>(store: &S) {
    setup(store).await;
    let attrs = vec![("a".to_string(), b("1")), ("b".to_string(), Bytes::new()), ("c".to_string(), pattern(300, 1))];
    submit(store, one(Op::SetAttrs { cid: C, oid: "obj".into(), attrs: attrs.clone() })).await;
    for (name, value) in &attrs {
        assert_eq!(store.getattr(C, "obj", name).await.unwrap(), value);
    }
    submit(store, one(Op::SetAttrs { cid: C, oid: "obj".into(), attrs: vec![("a".into(), b("2"))] })).await;
    let mut expected: BTreeMap<String, Bytes> = attrs.into_iter().collect();
    expected.insert("a".into(), b("2"));
    assert_eq!(store.getattrs(C, "obj").await.unwrap(), expected);
}

pub async fn getattr_of_missing_attr_is_attr_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    submit(store, one(Op::Touch { cid: C, oid: "obj".into() })).await;
    assert_eq!(kind(store.getattr(C, "obj", "nope").await), Some(AttrNotFound));
}

pub async fn rmattr_of_absent_attr_succeeds<S: ObjectStore>(store: &S) {
    setup(store).await;
    let mut t = Transaction::new();
    t.setattr(C, "obj", "a", b("1")).setattr(C, "obj", "b", b("2"));
    submit(store, t).await;
    let mut t = Transaction::new();
    t.rmattr(C, "obj", "a").rmattr(C, "obj", "never");
    submit(store, t).await;
    assert_eq!(kind(store.getattr(C, "obj", "a").await), Some(AttrNotFound));
    assert_eq!(store.getattrs(C, "obj").await.unwrap().into_keys().collect::<Vec<_>>(), ["b"]);
}

pub async fn removal_ops_need_an_existing_object<S: ObjectStore>(store: &S) {
    setup(store).await;
    let ops = [
        Op::Remove { cid: C, oid: "nope".into() },
        Op::RmAttr { cid: C, oid: "nope".into(), name: "a".into() },
        Op::OmapRmKeys { cid: C, oid: "nope".into(), keys: vec![b("k")] },
        Op::OmapClear { cid: C, oid: "nope".into() },
    ];
    for op in ops {
        fails(store, one(op), ObjectNotFound).await;
        assert!(!exists(store, "nope").await);
    }
}

pub async fn omap_set_get_and_remove_keys<S: ObjectStore>(store: &S) {
    setup(store).await;
    let kvs = vec![(b("k1"), b("v1")), (b("k2"), b("v2")), (b("k3"), pattern(1000, 1))];
    submit(store, one(Op::OmapSetKeys { cid: C, oid: "obj".into(), kvs: kvs.clone() })).await;
    let keys: Vec<Bytes> = kvs.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(store.omap_get_values(C, "obj", &keys).await.unwrap(), kvs.iter().cloned().collect());
    let mut t = Transaction::new();
    t.omap_rm(C, "obj", vec![b("k2"), b("absent")]).omap_set(C, "obj", vec![(b("k1"), b("new"))]);
    submit(store, t).await;
    let page = store.omap_iterate(C, "obj", None, 100).await.unwrap();
    assert_eq!(page.items, vec![(b("k1"), b("new")), (b("k3"), pattern(1000, 1))]);
    assert_eq!(page.next, None);
}

pub async fn omap_get_values_omits_missing_keys<S: ObjectStore>(store: &S) {
    setup(store).await;
    submit(store, one(Op::OmapSetKeys { cid: C, oid: "obj".into(), kvs: vec![(b("a"), b("1"))] })).await;
    let got = store.omap_get_values(C, "obj", &[b("x"), b("a"), b("")]).await.unwrap();
    assert_eq!(got, BTreeMap::from([(b("a"), b("1"))]));
}

pub async fn omap_iterate_honours_start_after_and_limit<S: ObjectStore>(store: &S) {
    setup(store).await;
    let mut kvs: Vec<(Bytes, Bytes)> = (0..10).map(|i| (b(&format!("k{i:02}")), b(&i.to_string()))).collect();
    kvs.push((Bytes::new(), b("empty key")));
    submit(store, one(Op::OmapSetKeys { cid: C, oid: "obj".into(), kvs })).await;
    let keys = |p: &crate::Page<(Bytes, Bytes), Bytes>| p.items.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    let ks = |names: &[&str]| names.iter().map(|n| b(n)).collect::<Vec<_>>();
    let p = store.omap_iterate(C, "obj", None, 4).await.unwrap();
    assert_eq!((keys(&p), p.next), (ks(&["", "k00", "k01", "k02"]), Some(b("k02"))));
    let p = store.omap_iterate(C, "obj", Some(b"k02"), 4).await.unwrap();
    assert_eq!((keys(&p), p.next), (ks(&["k03", "k04", "k05", "k06"]), Some(b("k06"))));
    let p = store.omap_iterate(C, "obj", Some(b"k06"), 4).await.unwrap();
    assert_eq!((keys(&p), p.next), (ks(&["k07", "k08", "k09"]), None));
    let p = store.omap_iterate(C, "obj", Some(b"k05"), 4).await.unwrap();
    assert_eq!((keys(&p), p.next), (ks(&["k06", "k07", "k08", "k09"]), None), "exactly filled last page");
    let p = store.omap_iterate(C, "obj", Some(b"k035"), 2).await.unwrap();
    assert_eq!((keys(&p), p.next), (ks(&["k04", "k05"]), Some(b("k05"))), "start_after need not exist");
    let p = store.omap_iterate(C, "obj", Some(b""), 1).await.unwrap();
    assert_eq!(keys(&p), ks(&["k00"]), "start_after is exclusive");
    let p = store.omap_iterate(C, "obj", Some(b"z"), 4).await.unwrap();
    assert_eq!((p.items.len(), p.next), (0, None));
}

pub async fn omap_header_round_trips_and_defaults_to_empty<S: ObjectStore>(store: &S) {
    setup(store).await;
    submit(store, one(Op::Touch { cid: C, oid: "obj".into() })).await;
    assert!(store.omap_get_header(C, "obj").await.unwrap().is_empty());
    submit(store, one(Op::OmapSetHeader { cid: C, oid: "obj".into(), header: pattern(500, 1) })).await;
    assert_eq!(store.omap_get_header(C, "obj").await.unwrap(), pattern(500, 1));
    submit(store, one(Op::OmapSetHeader { cid: C, oid: "obj".into(), header: b("h") })).await;
    assert_eq!(store.omap_get_header(C, "obj").await.unwrap(), b("h"));
}

pub async fn omap_clear_removes_keys_and_header<S: ObjectStore>(store: &S) {
    setup(store).await;
    let mut t = Transaction::new();
    t.write(C, "obj", 0, pattern(100, 1))
        .setattr(C, "obj", "a", b("1"))
        .omap_set(C, "obj", vec![(b("k"), b("v")), (b("l"), b("w"))])
        .omap_set_header(C, "obj", b("h"));
    submit(store, t).await;
    submit(store, one(Op::OmapClear { cid: C, oid: "obj".into() })).await;
    let got = dump_object(store, C, "obj").await;
    assert!(got.omap.is_empty() && got.omap_header.is_empty());
    assert_eq!((got.data, got.attrs.len()), (pattern(100, 1).to_vec(), 1), "data and xattrs stay");
}

/// A source object with something in every part.
async fn full_object<S: ObjectStore>(store: &S, oid: &str) {
    let mut t = Transaction::new();
    t.write(C, oid, 0, pattern(10_000, 1))
        .write(C, oid, 20_000, pattern(4096, 2))
        .setattr(C, oid, "a", b("1"))
        .setattr(C, oid, "b", b("2"))
        .omap_set(C, oid, vec![(b("k"), b("v"))])
        .omap_set_header(C, oid, b("hdr"));
    submit(store, t).await;
}

pub async fn clone_copies_data_attrs_and_omap<S: ObjectStore>(store: &S) {
    setup(store).await;
    full_object(store, "src").await;
    submit(store, one(Op::Clone { cid: C, src: "src".into(), dst: "dst".into() })).await;
    assert_eq!(dump_object(store, C, "dst").await, dump_object(store, C, "src").await);
}

pub async fn clone_is_independent_of_source_after_write<S: ObjectStore>(store: &S) {
    setup(store).await;
    full_object(store, "src").await;
    submit(store, one(Op::Clone { cid: C, src: "src".into(), dst: "dst".into() })).await;
    let original = dump_object(store, C, "src").await;
    let mut t = Transaction::new();
    t.write(C, "src", 0, pattern(4096, 7))
        .write(C, "src", 20_010, pattern(10, 7))
        .truncate(C, "src", 15_000)
        .setattr(C, "src", "a", b("changed"))
        .omap_set(C, "src", vec![(b("k"), b("changed"))]);
    submit(store, t).await;
    assert_eq!(dump_object(store, C, "dst").await, original, "writing the source changed the clone");
    let changed_src = dump_object(store, C, "src").await;
    let mut t = Transaction::new();
    t.write(C, "dst", 100, pattern(9000, 8)).zero(C, "dst", 20_000, 100).omap_clear(C, "dst");
    submit(store, t).await;
    assert_eq!(dump_object(store, C, "src").await, changed_src, "writing the clone changed the source");
}

pub async fn clone_replaces_existing_destination<S: ObjectStore>(store: &S) {
    setup(store).await;
    let mut t = Transaction::new();
    t.write(C, "src", 0, pattern(100, 1)).setattr(C, "src", "a", b("1"));
    t.write(C, "dst", 0, pattern(50_000, 2))
        .setattr(C, "dst", "other", b("x"))
        .omap_set(C, "dst", vec![(b("k"), b("v"))])
        .omap_set_header(C, "dst", b("h"));
    submit(store, t).await;
    submit(store, one(Op::Clone { cid: C, src: "src".into(), dst: "dst".into() })).await;
    assert_eq!(dump_object(store, C, "dst").await, dump_object(store, C, "src").await);
}

pub async fn clone_of_missing_source_is_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    fails(store, one(Op::Clone { cid: C, src: "nope".into(), dst: "dst".into() }), ObjectNotFound).await;
    assert!(!exists(store, "dst").await);
}

pub async fn clone_onto_itself_changes_nothing<S: ObjectStore>(store: &S) {
    setup(store).await;
    full_object(store, "obj").await;
    let before = dump(store).await;
    submit(store, one(Op::Clone { cid: C, src: "obj".into(), dst: "obj".into() })).await;
    assert_eq!(diff(&dump(store).await, &before), None);
}

pub async fn clone_range_copies_bytes_to_offset<S: ObjectStore>(store: &S) {
    setup(store).await;
    let src = pattern(20_000, 1);
    let dst = pattern(30_000, 2);
    write(store, "src", 0, &src).await;
    write(store, "dst", 0, &dst).await;
    let mut t = Transaction::new();
    t.clone_range(C, "src", "dst", 1000, 5000, 7000).clone_range(C, "src", "dst", 4096, 8192, 16_384);
    submit(store, t).await;
    let expected = overlay(&overlay(&dst, 7000, &src[1000..6000]), 16_384, &src[4096..12_288]);
    assert_eq!(read_all(store, "dst").await, expected);
    // The copy must not follow later writes to the source (even where pages might be shared).
    write(store, "src", 0, &pattern(20_000, 3)).await;
    assert_eq!(read_all(store, "dst").await, expected);
}

pub async fn clone_range_zero_fills_past_source_end<S: ObjectStore>(store: &S) {
    setup(store).await;
    let src = pattern(3000, 1);
    let dst = pattern(10_000, 2);
    write(store, "src", 0, &src).await;
    write(store, "dst", 0, &dst).await;
    submit(store, one(Op::CloneRange { cid: C, src: "src".into(), dst: "dst".into(), src_off: 2000, len: 4000, dst_off: 100 })).await;
    let expected = overlay(&overlay(&dst, 100, &src[2000..]), 1100, &[0; 3000]);
    assert_eq!(read_all(store, "dst").await, expected);
    submit(store, one(Op::CloneRange { cid: C, src: "src".into(), dst: "dst".into(), src_off: 0, len: 100, dst_off: 20_000 })).await;
    assert_eq!(read_all(store, "dst").await, overlay(&expected, 20_000, &src[..100]), "destination grows");
}

pub async fn clone_range_creates_destination<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "src", 0, &pattern(100, 1)).await;
    submit(store, one(Op::CloneRange { cid: C, src: "src".into(), dst: "dst".into(), src_off: 50, len: 200, dst_off: 10 })).await;
    assert_eq!(read_all(store, "dst").await, overlay(&overlay(&[0; 10], 10, &pattern(100, 1)[50..]), 60, &[0; 150]));
    assert_eq!(dump_object(store, C, "dst").await.attrs.len(), 0);
}

pub async fn clone_range_within_one_object_handles_overlap<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(10_000, 1);
    write(store, "obj", 0, &data).await;
    submit(store, one(Op::CloneRange { cid: C, src: "obj".into(), dst: "obj".into(), src_off: 0, len: 6000, dst_off: 2000 })).await;
    let forward = overlay(&data, 2000, &data[..6000]);
    assert_eq!(read_all(store, "obj").await, forward);
    submit(store, one(Op::CloneRange { cid: C, src: "obj".into(), dst: "obj".into(), src_off: 4096, len: 8192, dst_off: 0 })).await;
    let src_bytes = overlay(&forward[4096..], 10_000 - 4096, &[0; 2288]);
    assert_eq!(read_all(store, "obj").await, overlay(&forward, 0, &src_bytes));
}

pub async fn clone_range_of_missing_source_is_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    let op = Op::CloneRange { cid: C, src: "nope".into(), dst: "dst".into(), src_off: 0, len: 10, dst_off: 0 };
    fails(store, one(op), ObjectNotFound).await;
    assert!(!exists(store, "dst").await);
}

pub async fn create_existing_collection_fails<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(10, 1)).await;
    fails(store, one(Op::CreateCollection { cid: C }), CollectionExists).await;
    assert!(exists(store, "obj").await, "the failed create must not reset the collection");
}

pub async fn remove_nonempty_collection_fails<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(10, 1)).await;
    fails(store, one(Op::RemoveCollection { cid: C }), CollectionNotEmpty).await;
    assert!(exists(store, "obj").await);
    let mut t = Transaction::new();
    t.remove(C, "obj").remove_collection(C);
    submit(store, t).await;
    assert!(!store.collection_exists(C).await.unwrap());
}

pub async fn remove_missing_collection_is_not_found<S: ObjectStore>(store: &S) {
    fails(store, one(Op::RemoveCollection { cid: MISSING }), CollectionNotFound).await;
}

pub async fn collections_are_listed_in_order<S: ObjectStore>(store: &S) {
    let cids = [PgId { pool: 2, seed: 5 }, PgId { pool: 1, seed: 7 }, PgId { pool: 2, seed: 0 }, PgId { pool: 1, seed: 0 }];
    let mut t = Transaction::new();
    for cid in cids {
        t.create_collection(cid);
    }
    submit(store, t).await;
    let mut sorted = cids.to_vec();
    sorted.sort();
    assert_eq!(store.list_collections().await.unwrap(), sorted);
    for cid in cids {
        assert!(store.collection_exists(cid).await.unwrap());
    }
}

pub async fn ops_in_missing_collection_fail<S: ObjectStore>(store: &S) {
    setup(store).await;
    let (cid, o) = (MISSING, || "o".to_string());
    let ops = [
        Op::Touch { cid, oid: o() },
        Op::Write { cid, oid: o(), off: 0, data: b("x") },
        Op::Zero { cid, oid: o(), off: 0, len: 1 },
        Op::Truncate { cid, oid: o(), size: 1 },
        Op::Remove { cid, oid: o() },
        Op::SetAttrs { cid, oid: o(), attrs: vec![("a".into(), b("1"))] },
        Op::RmAttr { cid, oid: o(), name: "a".into() },
        Op::OmapSetKeys { cid, oid: o(), kvs: vec![] },
        Op::OmapRmKeys { cid, oid: o(), keys: vec![] },
        Op::OmapClear { cid, oid: o() },
        Op::OmapSetHeader { cid, oid: o(), header: b("h") },
        Op::Clone { cid, src: o(), dst: "d".into() },
        Op::CloneRange { cid, src: o(), dst: "d".into(), src_off: 0, len: 1, dst_off: 0 },
    ];
    for op in ops {
        fails(store, one(op), CollectionNotFound).await;
    }
    assert!(!store.collection_exists(MISSING).await.unwrap());
}

pub async fn removed_collection_can_be_recreated_empty<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(10, 1)).await;
    let mut t = Transaction::new();
    t.remove(C, "obj").remove_collection(C).create_collection(C);
    submit(store, t).await;
    assert!(store.list_objects(C, None, 10).await.unwrap().items.is_empty());
}

pub async fn list_objects_pages_in_order<S: ObjectStore>(store: &S) {
    setup(store).await;
    let names = ["b", "a0", "ä", "B", "a", "c", "_", "zz", "a00", "z"];
    let mut t = Transaction::new();
    for n in names {
        t.touch(C, n);
    }
    submit(store, t).await;
    let mut sorted: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    sorted.sort();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list_objects(C, after.as_deref(), 3).await.unwrap();
        assert!(page.items.len() <= 3);
        seen.extend(page.items.iter().cloned());
        match page.next {
            Some(next) => {
                assert_eq!(Some(&next), page.items.last());
                after = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(seen, sorted, "pages cover every object once, bytewise ordered");
    let page = store.list_objects(C, None, 10).await.unwrap();
    assert_eq!((page.items.len(), page.next), (10, None), "a page that fits everything ends the listing");
    let page = store.list_objects(C, Some("a000"), 2).await.unwrap();
    assert_eq!(page.items, ["b", "c"], "start_after need not exist");
    let page = store.list_objects(C, Some("ä"), 2).await.unwrap();
    assert_eq!((page.items.len(), page.next), (0, None), "nothing after the last name");
}

pub async fn list_objects_in_missing_collection_is_not_found<S: ObjectStore>(store: &S) {
    assert_eq!(kind(store.list_objects(MISSING, None, 5).await), Some(CollectionNotFound));
}

pub async fn zero_listing_limit_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    submit(store, one(Op::Touch { cid: C, oid: "obj".into() })).await;
    assert_eq!(kind(store.list_objects(C, None, 0).await), Some(InvalidArgument));
    assert_eq!(kind(store.omap_iterate(C, "obj", None, 0).await), Some(InvalidArgument));
}

/// Ops touching every kind of state, for the rollback cases.
fn everything(cid: CollectionId) -> Transaction {
    let mut t = Transaction::new();
    t.write(cid, "a", 100, pattern(9000, 9))
        .write(cid, "new", 0, pattern(4096, 9))
        .zero(cid, "a", 0, 50)
        .truncate(cid, "b", 3)
        .setattr(cid, "a", "x", b("changed"))
        .setattr(cid, "a", "fresh", b("1"))
        .rmattr(cid, "b", "x")
        .omap_set(cid, "a", vec![(b("k"), b("changed")), (b("k2"), b("v"))])
        .omap_rm(cid, "b", vec![b("k")])
        .omap_clear(cid, "c")
        .omap_set_header(cid, "a", b("changed"))
        .clone_object(cid, "a", "b")
        .clone_range(cid, "c", "a", 0, 8192, 4096)
        .remove(cid, "c")
        .touch(cid, "d")
        .create_collection(PgId { pool: 3, seed: 1 })
        .touch(PgId { pool: 3, seed: 1 }, "e");
    t
}

pub async fn failed_transaction_leaves_no_trace<S: ObjectStore>(store: &S) {
    setup(store).await;
    for oid in ["a", "b", "c"] {
        full_object(store, oid).await;
    }
    let before = dump(store).await;
    let failing = [
        (Op::Remove { cid: C, oid: "missing".into() }, ObjectNotFound),
        (Op::Write { cid: C, oid: String::new(), off: 0, data: b("x") }, InvalidArgument),
        (Op::CreateCollection { cid: C }, CollectionExists),
        (Op::Write { cid: C, oid: "a".into(), off: u64::MAX, data: b("x") }, InvalidArgument),
    ];
    for (last, expected) in failing {
        let mut t = everything(C);
        t.push(last);
        fails(store, t, expected).await;
        if let Some(d) = diff(&dump(store).await, &before) {
            panic!("failed transaction left a trace: {d}");
        }
    }
    // The same ops do apply when nothing fails, so the rollback above undid real changes.
    submit(store, everything(C)).await;
    assert!(diff(&dump(store).await, &before).is_some());
}

pub async fn failed_transaction_restores_removed_objects_and_collections<S: ObjectStore>(store: &S) {
    setup(store).await;
    full_object(store, "a").await;
    full_object(store, "b").await;
    let before = dump(store).await;
    let mut t = Transaction::new();
    t.remove(C, "a")
        .remove(C, "b")
        .remove_collection(C)
        .create_collection(C)
        .touch(C, "a")
        .remove(C, "a")
        .remove_collection(C)
        .remove_collection(C);
    fails(store, t, CollectionNotFound).await;
    assert_eq!(diff(&dump(store).await, &before), None);
}

pub async fn later_ops_see_earlier_ops_of_the_same_transaction<S: ObjectStore>(store: &S) {
    let mut t = Transaction::new();
    t.create_collection(C)
        .write(C, "a", 0, pattern(100, 1))
        .clone_object(C, "a", "b")
        .write(C, "a", 0, pattern(10, 2))
        .setattr(C, "b", "x", b("1"))
        .remove(C, "a")
        .touch(C, "a");
    submit(store, t).await;
    assert_eq!(size(store, "a").await, 0, "removed then recreated");
    assert_eq!(read_all(store, "b").await, pattern(100, 1), "the clone saw the first write only");
    assert_eq!(store.getattr(C, "b", "x").await.unwrap(), b("1"));
}

pub async fn empty_transaction_succeeds<S: ObjectStore>(store: &S) {
    submit(store, Transaction::new()).await;
    assert!(store.list_collections().await.unwrap().is_empty());
}

pub async fn oversized_name_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    let long = "n".repeat(OBJECT_NAME_LEN_MAX + 1);
    fails(store, one(Op::Touch { cid: C, oid: long.clone() }), InvalidArgument).await;
    fails(store, one(Op::Write { cid: C, oid: long.clone(), off: 0, data: b("x") }), InvalidArgument).await;
    assert_eq!(kind(store.read(C, &long, 0, 0).await), Some(InvalidArgument));
    assert_eq!(kind(store.stat(C, &long).await), Some(InvalidArgument));
    let longest = "n".repeat(OBJECT_NAME_LEN_MAX);
    submit(store, one(Op::Touch { cid: C, oid: longest.clone() })).await;
    assert!(exists(store, &longest).await);
    let long_attr = "a".repeat(ATTR_NAME_LEN_MAX + 1);
    let op = Op::SetAttrs { cid: C, oid: "obj".into(), attrs: vec![("ok".into(), b("1")), (long_attr.clone(), b("1"))] };
    fails(store, one(op), InvalidArgument).await;
    assert!(!exists(store, "obj").await, "a rejected op does not create its object");
    submit(store, one(Op::Touch { cid: C, oid: "obj".into() })).await;
    assert_eq!(kind(store.getattr(C, "obj", &long_attr).await), Some(InvalidArgument));
    fails(store, one(Op::RmAttr { cid: C, oid: "obj".into(), name: long_attr }), InvalidArgument).await;
    let longest_attr = "a".repeat(ATTR_NAME_LEN_MAX);
    submit(store, one(Op::SetAttrs { cid: C, oid: "obj".into(), attrs: vec![(longest_attr, b("1"))] })).await;
}

pub async fn empty_names_are_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    fails(store, one(Op::Touch { cid: C, oid: String::new() }), InvalidArgument).await;
    fails(store, one(Op::Clone { cid: C, src: String::new(), dst: "d".into() }), InvalidArgument).await;
    assert_eq!(kind(store.read(C, "", 0, 0).await), Some(InvalidArgument));
    submit(store, one(Op::Touch { cid: C, oid: "obj".into() })).await;
    fails(store, one(Op::SetAttrs { cid: C, oid: "obj".into(), attrs: vec![(String::new(), b("1"))] }), InvalidArgument).await;
    fails(store, one(Op::RmAttr { cid: C, oid: "obj".into(), name: String::new() }), InvalidArgument).await;
    assert_eq!(kind(store.getattr(C, "obj", "").await), Some(InvalidArgument));
}

pub async fn oversized_values_are_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    let big = Bytes::from(vec![1; VALUE_LEN_MAX + 1]);
    let max = Bytes::from(vec![1; VALUE_LEN_MAX]);
    let o = || "obj".to_string();
    for op in [
        Op::SetAttrs { cid: C, oid: o(), attrs: vec![("a".into(), big.clone())] },
        Op::OmapSetKeys { cid: C, oid: o(), kvs: vec![(b("k"), big.clone())] },
        Op::OmapSetKeys { cid: C, oid: o(), kvs: vec![(big.clone(), b("v"))] },
        Op::OmapSetHeader { cid: C, oid: o(), header: big.clone() },
        Op::Write { cid: C, oid: o(), off: 0, data: Bytes::from(vec![1; IO_LEN_MAX as usize + 1]) },
    ] {
        fails(store, one(op), InvalidArgument).await;
    }
    assert!(!exists(store, "obj").await);
    let mut t = Transaction::new();
    t.setattr(C, "obj", "a", max.clone()).omap_set(C, "obj", vec![(max.clone(), max.clone())]).omap_set_header(C, "obj", max);
    submit(store, t).await;
}

pub async fn offset_overflow_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(100, 1)).await;
    let before = dump(store).await;
    let o = || "obj".to_string();
    for op in [
        Op::Write { cid: C, oid: o(), off: u64::MAX - 2, data: b("0123456789") },
        Op::Zero { cid: C, oid: o(), off: u64::MAX, len: 1 },
        Op::Zero { cid: C, oid: o(), off: 1, len: u64::MAX },
        Op::Truncate { cid: C, oid: o(), size: u64::MAX },
        Op::CloneRange { cid: C, src: o(), dst: "d".into(), src_off: u64::MAX, len: 2, dst_off: 0 },
        Op::CloneRange { cid: C, src: o(), dst: "d".into(), src_off: 0, len: 2, dst_off: u64::MAX },
    ] {
        fails(store, one(op), InvalidArgument).await;
    }
    assert_eq!(kind(store.read(C, "obj", u64::MAX, 2).await), Some(InvalidArgument));
    assert_eq!(kind(store.readv(C, "obj", &[(0, 1), (u64::MAX, 2)]).await), Some(InvalidArgument));
    assert_eq!(diff(&dump(store).await, &before), None);
}

pub async fn extent_beyond_max_object_size_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    let o = || "obj".to_string();
    for op in [
        Op::Write { cid: C, oid: o(), off: OBJECT_SIZE_MAX - 5, data: b("0123456789") },
        Op::Zero { cid: C, oid: o(), off: OBJECT_SIZE_MAX, len: 1 },
        Op::Truncate { cid: C, oid: o(), size: OBJECT_SIZE_MAX + 1 },
    ] {
        fails(store, one(op), InvalidArgument).await;
    }
    assert_eq!(kind(store.read(C, "obj", OBJECT_SIZE_MAX, 1).await), Some(InvalidArgument));
    // Empty ranges ending exactly at the limit are fine (and, being empty, grow nothing).
    let mut t = Transaction::new();
    t.write(C, "obj", OBJECT_SIZE_MAX, Bytes::new()).zero(C, "obj", OBJECT_SIZE_MAX, 0);
    submit(store, t).await;
    assert_eq!(size(store, "obj").await, 0);
}

pub async fn statfs_counts_objects<S: ObjectStore>(store: &S) {
    setup(store).await;
    assert_eq!(store.statfs().objects, 0);
    let mut t = Transaction::new();
    t.touch(C, "a").touch(C, "b").write(C, "c", 0, pattern(10, 1));
    submit(store, t).await;
    assert_eq!(store.statfs().objects, 3);
    submit(store, one(Op::Remove { cid: C, oid: "a".into() })).await;
    submit(store, one(Op::Clone { cid: C, src: "c".into(), dst: "d".into() })).await;
    submit(store, one(Op::Clone { cid: C, src: "c".into(), dst: "b".into() })).await;
    assert_eq!(store.statfs().objects, 3);
    let mut t = Transaction::new();
    t.touch(C, "e").remove(C, "missing");
    fails(store, t, ObjectNotFound).await;
    assert_eq!(store.statfs().objects, 3);
}

pub async fn flush_succeeds<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(10, 1)).await;
    store.flush().await.unwrap();
    assert_eq!(read_all(store, "obj").await, pattern(10, 1));
}
