//! `Clone` and `CloneRange`.

use super::*;
use StoreErrorKind::*;

pub async fn clone_copies_data_attrs_and_omap<S: ObjectStore>(store: &S) {
    setup(store).await;
    full_object(store, "src").await;
    apply(store, |t| t.clone_object(C, "src", "dst")).await;
    assert_eq!(
        dump_object(store, C, "dst").await,
        dump_object(store, C, "src").await
    );
}

pub async fn clone_is_independent_of_source_after_write<S: ObjectStore>(store: &S) {
    setup(store).await;
    full_object(store, "src").await;
    apply(store, |t| t.clone_object(C, "src", "dst")).await;
    let original = dump_object(store, C, "src").await;
    apply(store, |t| {
        t.write(C, "src", 0, pattern(4096, 7))
            .write(C, "src", 20_010, pattern(10, 7))
            .truncate(C, "src", 15_000)
            .setattr(C, "src", "a", b("changed"))
            .omap_set(C, "src", vec![(b("k"), b("changed"))])
    })
    .await;
    assert_eq!(
        dump_object(store, C, "dst").await,
        original,
        "writing the source changed the clone"
    );
    let changed_src = dump_object(store, C, "src").await;
    apply(store, |t| {
        t.write(C, "dst", 100, pattern(9000, 8))
            .zero(C, "dst", 20_000, 100)
            .omap_clear(C, "dst")
    })
    .await;
    let src_now = dump_object(store, C, "src").await;
    assert_eq!(src_now, changed_src, "writing the clone changed the source");
}

pub async fn clone_replaces_existing_destination<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| {
        t.write(C, "src", 0, pattern(100, 1))
            .setattr(C, "src", "a", b("1"))
    })
    .await;
    full_object(store, "dst").await;
    apply(store, |t| t.write(C, "dst", 40_000, pattern(10, 3))).await;
    apply(store, |t| t.clone_object(C, "src", "dst")).await;
    assert_eq!(
        dump_object(store, C, "dst").await,
        dump_object(store, C, "src").await
    );
}

pub async fn clone_of_missing_source_is_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    fails(store, ObjectNotFound, |t| t.clone_object(C, "nope", "dst")).await;
    assert!(!exists(store, "dst").await);
}

pub async fn clone_onto_itself_changes_nothing<S: ObjectStore>(store: &S) {
    setup(store).await;
    full_object(store, "obj").await;
    let before = dump(store).await;
    apply(store, |t| t.clone_object(C, "obj", "obj")).await;
    assert_eq!(diff(&dump(store).await, &before), None);
}

pub async fn clone_range_copies_bytes_to_offset<S: ObjectStore>(store: &S) {
    setup(store).await;
    let src = pattern(20_000, 1);
    let dst = pattern(30_000, 2);
    write(store, "src", 0, &src).await;
    write(store, "dst", 0, &dst).await;
    // Unaligned, then whole pages at matching alignment (which a backend may share).
    apply(store, |t| {
        t.clone_range(C, "src", "dst", 1000, 5000, 7000)
            .clone_range(C, "src", "dst", 4096, 8192, 16_384)
    })
    .await;
    let expected = overlay(
        &overlay(&dst, 7000, &src[1000..6000]),
        16_384,
        &src[4096..12_288],
    );
    assert_eq!(read_all(store, "dst").await, expected);
    write(store, "src", 0, &pattern(20_000, 3)).await;
    assert_eq!(
        read_all(store, "dst").await,
        expected,
        "the copy followed a later source write"
    );
}

pub async fn clone_range_zero_fills_past_source_end<S: ObjectStore>(store: &S) {
    setup(store).await;
    let src = pattern(3000, 1);
    let dst = pattern(10_000, 2);
    write(store, "src", 0, &src).await;
    write(store, "dst", 0, &dst).await;
    apply(store, |t| t.clone_range(C, "src", "dst", 2000, 4000, 100)).await;
    let expected = overlay(&overlay(&dst, 100, &src[2000..]), 1100, &[0; 3000]);
    assert_eq!(read_all(store, "dst").await, expected);
    apply(store, |t| t.clone_range(C, "src", "dst", 0, 100, 20_000)).await;
    let grown = overlay(&expected, 20_000, &src[..100]);
    assert_eq!(
        read_all(store, "dst").await,
        grown,
        "the destination grows to cover the range"
    );
}

pub async fn clone_range_creates_destination<S: ObjectStore>(store: &S) {
    setup(store).await;
    let src = pattern(100, 1);
    write(store, "src", 0, &src).await;
    apply(store, |t| t.clone_range(C, "src", "dst", 50, 200, 10)).await;
    let expected = overlay(&overlay(&[0; 10], 10, &src[50..]), 60, &[0; 150]);
    assert_eq!(read_all(store, "dst").await, expected);
    assert!(
        store.getattrs(C, "dst").await.unwrap().is_empty(),
        "only data is copied"
    );
}

pub async fn clone_range_within_one_object_handles_overlap<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(10_000, 1);
    write(store, "obj", 0, &data).await;
    apply(store, |t| t.clone_range(C, "obj", "obj", 0, 6000, 2000)).await;
    let forward = overlay(&data, 2000, &data[..6000]);
    assert_eq!(
        read_all(store, "obj").await,
        forward,
        "copied as if through a buffer"
    );
    apply(store, |t| t.clone_range(C, "obj", "obj", 4096, 8192, 0)).await;
    let source = overlay(&forward[4096..], 10_000 - 4096, &[0; 2288]);
    assert_eq!(read_all(store, "obj").await, overlay(&forward, 0, &source));
}

pub async fn clone_range_of_missing_source_is_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    fails(store, ObjectNotFound, |t| {
        t.clone_range(C, "nope", "dst", 0, 10, 0)
    })
    .await;
    assert!(!exists(store, "dst").await);
}
