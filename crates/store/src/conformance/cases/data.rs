//! Object data: writes, reads, holes, zero, truncate, and the read methods' edge cases.

use super::*;
use carmine_types::limits::IO_LEN_MAX;
use StoreErrorKind::*;

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
    let writes = [
        (4000, 5000, 1),
        (4095, 1, 2),
        (4096, 1, 3),
        (12_000, 300, 4),
        (1, 8190, 5),
    ];
    for (off, len, salt) in writes {
        let data = pattern(len, salt);
        write(store, "obj", off as u64, &data).await;
        expected = overlay(&expected, off, &data);
    }
    assert_eq!(read_all(store, "obj").await, expected);
    let middle = store.read(C, "obj", 4000, 5000).await.unwrap();
    assert_eq!(middle, expected[4000..9000]);
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
    let off = (1 << 20) + 3;
    write(store, "obj", off as u64, &data).await;
    assert_eq!(
        read_all(store, "obj").await,
        overlay(&vec![0; off], off, &data)
    );
    assert_eq!(
        store.read(C, "obj", 500_000, 100).await.unwrap(),
        vec![0; 100]
    );
    apply(store, |t| t.truncate(C, "big", 3 << 20)).await;
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
    assert_eq!(
        store.read(C, "obj", 8000, 5000).await.unwrap(),
        data[8000..]
    );
}

pub async fn read_past_end_returns_empty<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(9000, 1)).await;
    for (off, len) in [(9000, 10), (9000, 0), (9001, 0), (100_000, 5)] {
        let got = store.read(C, "obj", off, len).await.unwrap();
        assert!(
            got.is_empty(),
            "read({off}, {len}) gave {} bytes",
            got.len()
        );
    }
    apply(store, |t| t.touch(C, "empty")).await;
    assert!(store.read(C, "empty", 0, 0).await.unwrap().is_empty());
}

pub async fn readv_returns_each_extent<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 0, &pattern(9000, 1)).await;
    let extents = [(0, 10), (8990, 100), (20_000, 5), (100, 0), (4090, 12)];
    let got = store.readv(C, "obj", &extents).await.unwrap();
    assert_eq!(got.len(), extents.len());
    for (&(off, len), bytes) in extents.iter().zip(&got) {
        let single = store.read(C, "obj", off, len).await.unwrap();
        assert_eq!(*bytes, single, "extent ({off}, {len})");
    }
    assert!(store.readv(C, "obj", &[]).await.unwrap().is_empty());
    assert_eq!(
        kind(store.readv(C, "nope", &[(0, 1)]).await),
        Some(ObjectNotFound)
    );
}

pub async fn read_into_appends_exactly_what_read_returns<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "obj", 5000, &pattern(10_000, 3)).await;
    for (off, len) in [
        (0, 4096),
        (4096, 4096),
        (5000, 10_000),
        (4000, 0),
        (14_000, 5000),
        (20_000, 10),
    ] {
        let expect = store.read(C, "obj", off, len).await.unwrap();
        let mut out = bytes::BytesMut::from(&b"prefix"[..]);
        let n = store.read_into(C, "obj", off, len, &mut out).await.unwrap();
        assert_eq!(n, expect.len(), "read_into({off}, {len}) length");
        assert_eq!(&out[..6], b"prefix");
        assert_eq!(&out[6..], &expect[..], "read_into({off}, {len}) bytes");
    }
    let mut out = bytes::BytesMut::from(&b"prefix"[..]);
    assert_eq!(
        kind(store.read_into(C, "nope", 0, 10, &mut out).await),
        Some(ObjectNotFound)
    );
    assert_eq!(
        &out[..],
        b"prefix",
        "a failed read_into must leave the buffer unchanged"
    );
}

pub async fn read_of_missing_object_is_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    let n = Some(ObjectNotFound);
    assert_eq!(kind(store.read(C, "nope", 0, 0).await), n);
    assert_eq!(kind(store.stat(C, "nope").await), n);
    assert_eq!(kind(store.getattr(C, "nope", "a").await), n);
    assert_eq!(kind(store.getattrs(C, "nope").await), n);
    assert_eq!(kind(store.omap_get_header(C, "nope").await), n);
    assert_eq!(kind(store.omap_get_values(C, "nope", &[b("k")]).await), n);
    assert_eq!(kind(store.omap_iterate(C, "nope", None, 10).await), n);
}

pub async fn oversized_read_is_rejected<S: ObjectStore>(store: &S) {
    setup(store).await;
    let max = IO_LEN_MAX as u64;
    apply(store, |t| t.truncate(C, "obj", max + 4096)).await;
    let inval = Some(InvalidArgument);
    assert_eq!(kind(store.read(C, "obj", 0, max + 1).await), inval);
    assert_eq!(
        kind(store.read(C, "obj", 0, 0).await),
        inval,
        "to the end is too long"
    );
    assert_eq!(
        kind(store.readv(C, "obj", &[(0, 1), (0, max + 1)]).await),
        inval
    );
    assert_eq!(
        store.read(C, "obj", 4096, 0).await.unwrap().len() as u64,
        max
    );
    assert_eq!(
        store.read(C, "obj", 0, max).await.unwrap().len() as u64,
        max
    );
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
    apply(store, |t| t.touch(C, "new")).await;
    assert_eq!(dump_object(store, C, "new").await, Default::default());
    full_object(store, "obj").await;
    let before = dump_object(store, C, "obj").await;
    apply(store, |t| t.touch(C, "obj")).await;
    assert_eq!(dump_object(store, C, "obj").await, before);
}

pub async fn zero_clears_range_and_extends_object<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(10_000, 1);
    write(store, "obj", 0, &data).await;
    apply(store, |t| t.zero(C, "obj", 100, 5000)).await;
    let expected = overlay(&data, 100, &[0; 5000]);
    assert_eq!(read_all(store, "obj").await, expected);
    apply(store, |t| t.zero(C, "obj", 9000, 3000)).await;
    let expected = overlay(&expected, 9000, &[0; 3000]);
    assert_eq!(read_all(store, "obj").await, expected);
    assert_eq!(size(store, "obj").await, 12_000);
    apply(store, |t| t.zero(C, "obj", 50_000, 0)).await;
    assert_eq!(
        size(store, "obj").await,
        12_000,
        "an empty range does not extend"
    );
}

pub async fn truncate_shrinks_and_zero_fills_on_regrow<S: ObjectStore>(store: &S) {
    setup(store).await;
    let data = pattern(10_000, 1);
    write(store, "obj", 0, &data).await;
    apply(store, |t| t.truncate(C, "obj", 5000)).await;
    assert_eq!(read_all(store, "obj").await, data[..5000]);
    apply(store, |t| t.truncate(C, "obj", 10_000)).await;
    assert_eq!(
        read_all(store, "obj").await,
        overlay(&data[..5000], 5000, &[0; 5000])
    );
    // The same inside one transaction, growing by a write rather than a truncate.
    let end = pattern(1, 2);
    apply(store, |t| {
        let t = t.write(C, "two", 0, data.clone()).truncate(C, "two", 4096);
        t.write(C, "two", 9999, end.clone())
    })
    .await;
    let expected = overlay(&overlay(&data[..4096], 4096, &[0; 5903]), 9999, &end);
    assert_eq!(read_all(store, "two").await, expected);
}

pub async fn truncate_extends_with_zeros<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| t.truncate(C, "obj", 7000)).await;
    assert_eq!(read_all(store, "obj").await, vec![0; 7000]);
    apply(store, |t| t.truncate(C, "obj", 0)).await;
    assert_eq!(size(store, "obj").await, 0);
}
