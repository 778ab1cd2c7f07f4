//! Xattrs, omap and the omap header, and which ops create or need an object.

use super::*;
use std::collections::BTreeMap;
use StoreErrorKind::*;

pub async fn setters_create_missing_objects<S: ObjectStore>(store: &S) {
    setup(store).await;
    write(store, "src", 0, &pattern(10, 1)).await;
    let creators: [(&str, Build); 8] = [
        ("touch", |t| t.touch(C, "touch")),
        ("write", |t| {
            t.write(C, "write", 0, Bytes::from_static(b"x"))
        }),
        ("zero", |t| t.zero(C, "zero", 0, 10)),
        ("truncate", |t| t.truncate(C, "truncate", 10)),
        ("setattrs", |t| {
            t.push(crate::Op::SetAttrs {
                cid: C,
                oid: "setattrs".into(),
                attrs: vec![],
            })
        }),
        ("omap", |t| t.omap_set(C, "omap", vec![])),
        ("header", |t| {
            t.omap_set_header(C, "header", Bytes::from_static(b"h"))
        }),
        ("range", |t| t.clone_range(C, "src", "range", 0, 5, 0)),
    ];
    for (oid, f) in creators {
        apply(store, f).await;
        assert!(exists(store, oid).await, "{oid} was not created");
    }
}

pub async fn remove_deletes_object_and_all_its_metadata<S: ObjectStore>(store: &S) {
    setup(store).await;
    full_object(store, "obj").await;
    apply(store, |t| t.remove(C, "obj")).await;
    assert!(!exists(store, "obj").await);
    assert!(store
        .list_objects(C, None, 10)
        .await
        .unwrap()
        .items
        .is_empty());
    apply(store, |t| t.touch(C, "obj")).await;
    let fresh = dump_object(store, C, "obj").await;
    assert_eq!(fresh, Default::default(), "a recreated object starts empty");
}

pub async fn remove_of_missing_object_is_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    fails(store, ObjectNotFound, |t| t.remove(C, "nope")).await;
}

pub async fn removal_ops_need_an_existing_object<S: ObjectStore>(store: &S) {
    setup(store).await;
    let removals: [Build; 4] = [
        |t| t.remove(C, "nope"),
        |t| t.rmattr(C, "nope", "a"),
        |t| t.omap_rm(C, "nope", vec![Bytes::from_static(b"k")]),
        |t| t.omap_clear(C, "nope"),
    ];
    for f in removals {
        fails(store, ObjectNotFound, f).await;
        assert!(!exists(store, "nope").await);
    }
}

pub async fn setattrs_and_getattr_round_trip<S: ObjectStore>(store: &S) {
    setup(store).await;
    let attrs = vec![
        ("a".to_string(), b("1")),
        ("b".into(), Bytes::new()),
        ("c".into(), pattern(300, 1)),
    ];
    let op = crate::Op::SetAttrs {
        cid: C,
        oid: "obj".into(),
        attrs: attrs.clone(),
    };
    apply(store, |t| t.push(op)).await;
    for (name, value) in &attrs {
        assert_eq!(store.getattr(C, "obj", name).await.unwrap(), value);
    }
    apply(store, |t| t.setattr(C, "obj", "a", b("2"))).await;
    let mut expected: BTreeMap<String, Bytes> = attrs.into_iter().collect();
    expected.insert("a".into(), b("2"));
    assert_eq!(store.getattrs(C, "obj").await.unwrap(), expected);
}

pub async fn getattr_of_missing_attr_is_attr_not_found<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| t.touch(C, "obj")).await;
    assert_eq!(
        kind(store.getattr(C, "obj", "nope").await),
        Some(AttrNotFound)
    );
}

pub async fn rmattr_of_absent_attr_succeeds<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| {
        t.setattr(C, "obj", "a", b("1"))
            .setattr(C, "obj", "b", b("2"))
    })
    .await;
    apply(store, |t| t.rmattr(C, "obj", "a").rmattr(C, "obj", "never")).await;
    assert_eq!(kind(store.getattr(C, "obj", "a").await), Some(AttrNotFound));
    let names: Vec<String> = store
        .getattrs(C, "obj")
        .await
        .unwrap()
        .into_keys()
        .collect();
    assert_eq!(names, ["b"]);
}

pub async fn omap_set_get_and_remove_keys<S: ObjectStore>(store: &S) {
    setup(store).await;
    let kvs = vec![
        (b("k1"), b("v1")),
        (b("k2"), b("v2")),
        (b("k3"), pattern(1000, 1)),
    ];
    apply(store, |t| t.omap_set(C, "obj", kvs.clone())).await;
    let keys: Vec<Bytes> = kvs.iter().map(|(k, _)| k.clone()).collect();
    let got = store.omap_get_values(C, "obj", &keys).await.unwrap();
    assert_eq!(got, kvs.iter().cloned().collect());
    apply(store, |t| {
        t.omap_rm(C, "obj", vec![b("k2"), b("absent")]).omap_set(
            C,
            "obj",
            vec![(b("k1"), b("new"))],
        )
    })
    .await;
    let page = store.omap_iterate(C, "obj", None, 100).await.unwrap();
    assert_eq!(
        page.items,
        vec![(b("k1"), b("new")), (b("k3"), pattern(1000, 1))]
    );
    assert_eq!(page.next, None);
}

pub async fn omap_get_values_omits_missing_keys<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| t.omap_set(C, "obj", vec![(b("a"), b("1"))])).await;
    let got = store
        .omap_get_values(C, "obj", &[b("x"), b("a"), b("")])
        .await
        .unwrap();
    assert_eq!(got, BTreeMap::from([(b("a"), b("1"))]));
}

pub async fn omap_iterate_honours_start_after_and_limit<S: ObjectStore>(store: &S) {
    setup(store).await;
    let mut kvs: Vec<(Bytes, Bytes)> = (0..10)
        .map(|i| (b(&format!("k{i:02}")), b(&i.to_string())))
        .collect();
    kvs.push((Bytes::new(), b("the empty key")));
    apply(store, |t| t.omap_set(C, "obj", kvs)).await;
    let page = |after: Option<&'static str>, limit| async move {
        let p = store
            .omap_iterate(C, "obj", after.map(str::as_bytes), limit)
            .await
            .unwrap();
        let keys: Vec<String> = p
            .items
            .iter()
            .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
            .collect();
        (keys, p.next.map(|n| String::from_utf8(n.to_vec()).unwrap()))
    };
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        page(None, 4).await,
        (
            vec!["".into(), "k00".into(), "k01".into(), "k02".into()],
            some("k02")
        )
    );
    assert_eq!(
        page(Some("k02"), 4).await,
        (
            vec!["k03".into(), "k04".into(), "k05".into(), "k06".into()],
            some("k06")
        )
    );
    assert_eq!(
        page(Some("k06"), 4).await,
        (vec!["k07".into(), "k08".into(), "k09".into()], None)
    );
    let exact = page(Some("k05"), 4).await;
    assert_eq!(
        exact,
        (
            vec!["k06".into(), "k07".into(), "k08".into(), "k09".into()],
            None
        ),
        "exactly full last page"
    );
    let between = page(Some("k035"), 2).await;
    assert_eq!(
        between,
        (vec!["k04".into(), "k05".into()], some("k05")),
        "start_after need not exist"
    );
    assert_eq!(
        page(Some(""), 1).await.0,
        ["k00"],
        "start_after is exclusive"
    );
    assert_eq!(page(Some("z"), 4).await, (vec![], None));
}

pub async fn omap_header_round_trips_and_defaults_to_empty<S: ObjectStore>(store: &S) {
    setup(store).await;
    apply(store, |t| t.touch(C, "obj")).await;
    assert!(store.omap_get_header(C, "obj").await.unwrap().is_empty());
    apply(store, |t| t.omap_set_header(C, "obj", pattern(500, 1))).await;
    assert_eq!(
        store.omap_get_header(C, "obj").await.unwrap(),
        pattern(500, 1)
    );
    apply(store, |t| t.omap_set_header(C, "obj", b("h"))).await;
    assert_eq!(store.omap_get_header(C, "obj").await.unwrap(), b("h"));
}

pub async fn omap_clear_removes_keys_and_header<S: ObjectStore>(store: &S) {
    setup(store).await;
    full_object(store, "obj").await;
    let before = dump_object(store, C, "obj").await;
    apply(store, |t| t.omap_clear(C, "obj")).await;
    let after = dump_object(store, C, "obj").await;
    assert!(
        after.omap.is_empty() && after.omap_header.is_empty(),
        "{after:?}"
    );
    assert_eq!(
        (after.data, after.attrs),
        (before.data, before.attrs),
        "data and xattrs stay"
    );
}
