//! Compare ops: guards that make a transaction conditional on an object's state.

use super::*;
use crate::Expect;
use StoreErrorKind::*;

fn xattr(name: &str, value: Option<&str>) -> Expect {
    Expect::Xattr {
        name: name.into(),
        value: value.map(b),
    }
}

fn omap_key(key: &str, value: Option<&str>) -> Expect {
    Expect::OmapKey {
        key: b(key),
        value: value.map(b),
    }
}

pub async fn compare_that_holds_lets_the_transaction_apply<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| {
        t.setattr(C, "o", "lock", b("v1"))
            .omap_set(C, "dir", vec![(b("name_x"), b("id1"))])
    })
    .await;
    apply(store, |t| {
        t.compare(C, "o", xattr("lock", Some("v1")))
            .compare(C, "dir", omap_key("name_y", None))
            .compare(C, "new", Expect::Absent)
            .setattr(C, "o", "lock", b("v2"))
            .omap_set(C, "dir", vec![(b("name_y"), b("id2"))])
            .touch(C, "new")
    })
    .await;
    assert_eq!(store.getattr(C, "o", "lock").await.unwrap(), b("v2"));
    let got = store
        .omap_get_values(C, "dir", &[b("name_y")])
        .await
        .unwrap();
    assert_eq!(got.get(&b("name_y")), Some(&b("id2")));
    assert!(store.stat(C, "new").await.is_ok());
}

pub async fn failed_compare_changes_nothing<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| {
        t.setattr(C, "o", "lock", b("v1"))
            .omap_set(C, "dir", vec![(b("name_x"), b("id1"))])
    })
    .await;
    let before = dump(store).await;
    let failing: [(StoreErrorKind, Build); 6] = [
        (CompareFailed, |t| {
            t.compare(C, "o", xattr("lock", Some("v0")))
        }),
        (CompareFailed, |t| t.compare(C, "o", xattr("lock", None))),
        (CompareFailed, |t| {
            t.compare(C, "o", xattr("other", Some("")))
        }),
        (CompareFailed, |t| {
            t.compare(C, "dir", omap_key("name_x", None))
        }),
        (CompareFailed, |t| {
            t.compare(C, "dir", omap_key("name_x", Some("id2")))
        }),
        (ObjectExists, |t| t.compare(C, "o", Expect::Absent)),
    ];
    for (expected, guard) in failing {
        fails(store, expected, |t| {
            guard(t)
                .setattr(C, "o", "lock", b("stolen"))
                .omap_set(C, "dir", vec![(b("name_x"), b("stolen"))])
                .touch(C, "created")
        })
        .await;
        if let Some(d) = diff(&dump(store).await, &before) {
            panic!("a failed compare left a trace: {d}");
        }
    }
}

pub async fn missing_object_compares_as_having_no_attrs_or_keys<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| {
        t.compare(C, "ghost", xattr("lock", None))
            .compare(C, "ghost", omap_key("k", None))
            .compare(C, "ghost", Expect::Absent)
    })
    .await;
    fails(store, CompareFailed, |t| {
        t.compare(C, "ghost", xattr("lock", Some("")))
    })
    .await;
    fails(store, CollectionNotFound, |t| {
        t.compare(MISSING, "ghost", Expect::Absent)
    })
    .await;
}

pub async fn compare_after_another_op_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    let before = dump(store).await;
    fails(store, InvalidArgument, |t| {
        t.touch(C, "a").compare(C, "a", Expect::Absent)
    })
    .await;
    assert!(diff(&dump(store).await, &before).is_none());
}
