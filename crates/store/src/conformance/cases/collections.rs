//! Collections, listings, statfs and flush.

use super::*;
use StoreErrorKind::*;

pub async fn create_existing_collection_fails<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(10, 1)).await;
    fails(store, CollectionExists, |t| t.create_collection(C)).await;
    assert!(
        exists(store, "obj").await,
        "the failed create must not reset the collection"
    );
}

pub async fn remove_nonempty_collection_fails<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(10, 1)).await;
    fails(store, CollectionNotEmpty, |t| t.remove_collection(C)).await;
    assert!(exists(store, "obj").await);
    apply(store, |t| t.remove(C, "obj").remove_collection(C)).await;
    assert!(!store.collection_exists(C).await.unwrap());
}

pub async fn remove_missing_collection_is_not_found<S: ObjectStore>(store: &S) {
    fails(store, CollectionNotFound, |t| t.remove_collection(MISSING)).await;
}

pub async fn collections_are_listed_in_order<S: ObjectStore>(store: &S) {
    let cids = [(2, 5), (1, 7), (2, 0), (1, 0)].map(|(pool, seed)| PgId { pool, seed });
    apply(store, |t| {
        cids.iter().fold(t, |t, &cid| t.create_collection(cid))
    })
    .await;
    let mut sorted = cids.to_vec();
    sorted.sort();
    assert_eq!(store.list_collections().await.unwrap(), sorted);
    for cid in cids {
        assert!(store.collection_exists(cid).await.unwrap());
    }
}

pub async fn ops_in_missing_collection_fail<S: ObjectStore>(store: &S) {
    setup(store).await;
    let ops: [Build; 13] = [
        |t| t.touch(MISSING, "o"),
        |t| t.write(MISSING, "o", 0, Bytes::from_static(b"x")),
        |t| t.zero(MISSING, "o", 0, 1),
        |t| t.truncate(MISSING, "o", 1),
        |t| t.remove(MISSING, "o"),
        |t| t.setattr(MISSING, "o", "a", Bytes::from_static(b"1")),
        |t| t.rmattr(MISSING, "o", "a"),
        |t| t.omap_set(MISSING, "o", vec![]),
        |t| t.omap_rm(MISSING, "o", vec![]),
        |t| t.omap_clear(MISSING, "o"),
        |t| t.omap_set_header(MISSING, "o", Bytes::from_static(b"h")),
        |t| t.clone_object(MISSING, "o", "d"),
        |t| t.clone_range(MISSING, "o", "d", 0, 1, 0),
    ];
    for f in ops {
        fails(store, CollectionNotFound, f).await;
    }
    assert!(!store.collection_exists(MISSING).await.unwrap());
}

pub async fn read_in_missing_collection_is_collection_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    let n = Some(CollectionNotFound);
    assert_eq!(kind(store.read(MISSING, "o", 0, 0).await), n);
    assert_eq!(kind(store.readv(MISSING, "o", &[(0, 1)]).await), n);
    assert_eq!(kind(store.stat(MISSING, "o").await), n);
    assert_eq!(kind(store.getattr(MISSING, "o", "a").await), n);
    assert_eq!(kind(store.getattrs(MISSING, "o").await), n);
    assert_eq!(kind(store.omap_get_header(MISSING, "o").await), n);
    assert_eq!(kind(store.omap_get_values(MISSING, "o", &[]).await), n);
    assert_eq!(kind(store.omap_iterate(MISSING, "o", None, 10).await), n);
    assert_eq!(kind(store.list_objects(MISSING, None, 10).await), n);
    assert!(!store.collection_exists(MISSING).await.unwrap());
}

pub async fn removed_collection_can_be_recreated_empty<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(10, 1)).await;
    apply(store, |t| {
        t.remove(C, "obj").remove_collection(C).create_collection(C)
    })
    .await;
    assert!(store
        .list_objects(C, None, 10)
        .await
        .unwrap()
        .items
        .is_empty());
}

pub async fn list_objects_pages_in_order<S: ObjectStore>(store: &S) {
    setup(store).await;
    let names = ["b", "a0", "ä", "B", "a", "c", "_", "zz", "a00", "z"];
    apply(store, |t| names.iter().fold(t, |t, n| t.touch(C, n))).await;
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
    assert_eq!(
        seen, sorted,
        "pages cover every object once, bytewise ordered"
    );
    let all = store.list_objects(C, None, 10).await.unwrap();
    assert_eq!(
        (all.items.len(), all.next),
        (10, None),
        "a page holding the rest ends the listing"
    );
    let page = store.list_objects(C, Some("a000"), 2).await.unwrap();
    assert_eq!(page.items, ["b", "c"], "start_after need not exist");
    let page = store.list_objects(C, Some("ä"), 2).await.unwrap();
    assert_eq!(
        (page.items.len(), page.next),
        (0, None),
        "nothing after the last name"
    );
}

pub async fn list_objects_in_missing_collection_is_not_found<S: ObjectStore>(store: &S) {
    assert_eq!(
        kind(store.list_objects(MISSING, None, 5).await),
        Some(CollectionNotFound)
    );
}

pub async fn zero_listing_limit_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| t.touch(C, "obj")).await;
    assert_eq!(
        kind(store.list_objects(C, None, 0).await),
        Some(InvalidArgument)
    );
    assert_eq!(
        kind(store.omap_iterate(C, "obj", None, 0).await),
        Some(InvalidArgument)
    );
}

pub async fn statfs_counts_objects<S: ObjectStore>(store: &S) {
    setup(store).await;
    assert_eq!(store.statfs().objects, 0);
    apply(store, |t| {
        t.touch(C, "a")
            .touch(C, "b")
            .write(C, "c", 0, pattern(10, 1))
    })
    .await;
    assert_eq!(store.statfs().objects, 3);
    apply(store, |t| t.remove(C, "a")).await;
    apply(store, |t| {
        t.clone_object(C, "c", "d").clone_object(C, "c", "b")
    })
    .await;
    assert_eq!(
        store.statfs().objects,
        3,
        "a clone onto an existing object adds none"
    );
    fails(store, ObjectNotFound, |t| {
        t.touch(C, "e").remove(C, "missing")
    })
    .await;
    assert_eq!(store.statfs().objects, 3);
}

pub async fn flush_succeeds<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(10, 1)).await;
    store.flush().await.unwrap();
    assert_eq!(read_all(store, "obj").await, pattern(10, 1));
}
