//! Atomicity, ordering inside a transaction, and argument validation.

use super::*;
use crate::Op;
use carmine_types::limits::{
    ATTR_NAME_LEN_MAX, IO_LEN_MAX, OBJECT_NAME_LEN_MAX, OBJECT_SIZE_MAX, VALUE_LEN_MAX,
};
use StoreErrorKind::*;

/// Valid ops touching every kind of state (given objects a, b, c from `full_object`).
fn everything(t: &mut Transaction) -> &mut Transaction {
    let other = PgId { pool: 3, seed: 1 };
    t.write(C, "a", 100, pattern(9000, 9))
        .write(C, "new", 0, pattern(4096, 9))
        .zero(C, "a", 0, 50)
        .truncate(C, "b", 3)
        .setattr(C, "a", "a", b("changed"))
        .setattr(C, "a", "fresh", b("1"))
        .rmattr(C, "b", "b")
        .omap_set(C, "a", vec![(b("k"), b("changed")), (b("k2"), b("v"))])
        .omap_rm(C, "b", vec![b("k")])
        .omap_clear(C, "c")
        .omap_set_header(C, "a", b("changed"))
        .clone_object(C, "a", "b")
        .clone_range(C, "c", "a", 0, 8192, 4096)
        .remove(C, "c")
        .touch(C, "d")
        .create_collection(other)
        .touch(other, "e")
}

pub async fn failed_transaction_leaves_no_trace<S: ObjectStore>(store: &S) {
    setup(store).await;
    for oid in ["a", "b", "c"] {
        full_object(store, oid).await;
    }
    let before = dump(store).await;
    let failing: [(StoreErrorKind, Build); 4] = [
        (ObjectNotFound, |t| t.remove(C, "missing")),
        (InvalidArgument, |t| t.touch(C, "")),
        (CollectionExists, |t| t.create_collection(C)),
        (InvalidArgument, |t| {
            t.write(C, "a", u64::MAX, Bytes::from_static(b"x"))
        }),
    ];
    for (expected, last) in failing {
        fails(store, expected, |t| last(everything(t))).await;
        if let Some(d) = diff(&dump(store).await, &before) {
            panic!("a failed transaction left a trace: {d}");
        }
    }
    // The same ops do apply when nothing fails, so the rollbacks above undid real changes.
    apply(store, everything).await;
    assert!(diff(&dump(store).await, &before).is_some());
}

pub async fn failed_transaction_restores_removed_objects_and_collections<S: ObjectStore>(
    store: &S,
) {
    setup(store).await;
    full_object(store, "a").await;
    full_object(store, "b").await;
    let before = dump(store).await;
    fails(store, CollectionNotFound, |t| {
        t.remove(C, "a")
            .remove(C, "b")
            .remove_collection(C)
            .create_collection(C)
            .touch(C, "a")
            .remove(C, "a")
            .remove_collection(C)
            .remove_collection(C)
    })
    .await;
    assert_eq!(diff(&dump(store).await, &before), None);
}

pub async fn later_ops_see_earlier_ops_of_the_same_transaction<S: ObjectStore>(store: &S) {
    apply(store, |t| {
        t.create_collection(C)
            .write(C, "a", 0, pattern(100, 1))
            .clone_object(C, "a", "b")
            .write(C, "a", 0, pattern(10, 2))
            .setattr(C, "b", "x", b("1"))
            .remove(C, "a")
            .touch(C, "a")
    })
    .await;
    assert_eq!(size(store, "a").await, 0, "removed then recreated");
    assert_eq!(
        read_all(store, "b").await,
        pattern(100, 1),
        "the clone saw the first write only"
    );
    assert_eq!(store.getattr(C, "b", "x").await.unwrap(), b("1"));
}

pub async fn empty_transaction_succeeds<S: ObjectStore>(store: &S) {
    apply(store, |t| t).await;
    assert!(store.list_collections().await.unwrap().is_empty());
}

pub async fn oversized_name_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    let long = "n".repeat(OBJECT_NAME_LEN_MAX + 1);
    fails(store, InvalidArgument, |t| t.touch(C, &long)).await;
    fails(store, InvalidArgument, |t| t.write(C, &long, 0, b("x"))).await;
    assert_eq!(
        kind(store.read(C, &long, 0, 0).await),
        Some(InvalidArgument)
    );
    assert_eq!(kind(store.stat(C, &long).await), Some(InvalidArgument));
    let longest = "n".repeat(OBJECT_NAME_LEN_MAX);
    apply(store, |t| t.touch(C, &longest)).await;
    assert!(exists(store, &longest).await);

    let long_attr = "a".repeat(ATTR_NAME_LEN_MAX + 1);
    let attrs = vec![("ok".to_string(), b("1")), (long_attr.clone(), b("1"))];
    fails(store, InvalidArgument, |t| {
        t.push(Op::SetAttrs {
            cid: C,
            oid: "obj".into(),
            attrs,
        })
    })
    .await;
    assert!(
        !exists(store, "obj").await,
        "a rejected op does not create its object"
    );
    apply(store, |t| t.touch(C, "obj")).await;
    assert_eq!(
        kind(store.getattr(C, "obj", &long_attr).await),
        Some(InvalidArgument)
    );
    fails(store, InvalidArgument, |t| t.rmattr(C, "obj", &long_attr)).await;
    apply(store, |t| {
        t.setattr(C, "obj", &"a".repeat(ATTR_NAME_LEN_MAX), b("1"))
    })
    .await;
}

pub async fn empty_names_are_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    fails(store, InvalidArgument, |t| t.touch(C, "")).await;
    fails(store, InvalidArgument, |t| t.clone_object(C, "", "d")).await;
    assert_eq!(kind(store.read(C, "", 0, 0).await), Some(InvalidArgument));
    apply(store, |t| t.touch(C, "obj")).await;
    fails(store, InvalidArgument, |t| t.setattr(C, "obj", "", b("1"))).await;
    fails(store, InvalidArgument, |t| t.rmattr(C, "obj", "")).await;
    assert_eq!(
        kind(store.getattr(C, "obj", "").await),
        Some(InvalidArgument)
    );
}

pub async fn oversized_values_are_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    let big = Bytes::from(vec![1; VALUE_LEN_MAX + 1]);
    let max = Bytes::from(vec![1; VALUE_LEN_MAX]);
    let huge_write = Bytes::from(vec![1; IO_LEN_MAX as usize + 1]);
    fails(store, InvalidArgument, |t| {
        t.setattr(C, "obj", "a", big.clone())
    })
    .await;
    fails(store, InvalidArgument, |t| {
        t.omap_set(C, "obj", vec![(b("k"), big.clone())])
    })
    .await;
    fails(store, InvalidArgument, |t| {
        t.omap_set(C, "obj", vec![(big.clone(), b("v"))])
    })
    .await;
    fails(store, InvalidArgument, |t| {
        t.omap_set_header(C, "obj", big.clone())
    })
    .await;
    fails(store, InvalidArgument, |t| t.write(C, "obj", 0, huge_write)).await;
    assert!(!exists(store, "obj").await);
    apply(store, |t| {
        t.setattr(C, "obj", "a", max.clone())
            .omap_set(C, "obj", vec![(max.clone(), max.clone())])
            .omap_set_header(C, "obj", max.clone())
    })
    .await;
}

pub async fn offset_overflow_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(100, 1)).await;
    let before = dump(store).await;
    let overflowing: [Build; 6] = [
        |t| t.write(C, "obj", u64::MAX - 2, Bytes::from_static(b"0123456789")),
        |t| t.zero(C, "obj", u64::MAX, 1),
        |t| t.zero(C, "obj", 1, u64::MAX),
        |t| t.truncate(C, "obj", u64::MAX),
        |t| t.clone_range(C, "obj", "d", u64::MAX, 2, 0),
        |t| t.clone_range(C, "obj", "d", 0, 2, u64::MAX),
    ];
    for f in overflowing {
        fails(store, InvalidArgument, f).await;
    }
    assert_eq!(
        kind(store.read(C, "obj", u64::MAX, 2).await),
        Some(InvalidArgument)
    );
    let readv = store.readv(C, "obj", &[(0, 1), (u64::MAX, 2)]).await;
    assert_eq!(kind(readv), Some(InvalidArgument));
    assert_eq!(diff(&dump(store).await, &before), None);
}

pub async fn extent_beyond_max_object_size_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    let beyond: [Build; 3] = [
        |t| {
            t.write(
                C,
                "obj",
                OBJECT_SIZE_MAX - 5,
                Bytes::from_static(b"0123456789"),
            )
        },
        |t| t.zero(C, "obj", OBJECT_SIZE_MAX, 1),
        |t| t.truncate(C, "obj", OBJECT_SIZE_MAX + 1),
    ];
    for f in beyond {
        fails(store, InvalidArgument, f).await;
    }
    assert_eq!(
        kind(store.read(C, "obj", OBJECT_SIZE_MAX, 1).await),
        Some(InvalidArgument)
    );
    // Empty ranges ending exactly at the limit are fine (and, being empty, grow nothing).
    apply(store, |t| {
        t.write(C, "obj", OBJECT_SIZE_MAX, Bytes::new())
            .zero(C, "obj", OBJECT_SIZE_MAX, 0)
    })
    .await;
    assert_eq!(size(store, "obj").await, 0);
}
