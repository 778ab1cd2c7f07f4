//! The conformance suite every `ObjectStore` backend must pass, written only against the trait.
//!
//! Two halves:
//! - hand-written cases (`cases`), one `pub async fn` per behaviour, named as sentences;
//! - a randomised comparison against [`crate::model::ModelStore`] (`random`): random
//!   transactions and reads over a small name space, including invalid ones so rollback is
//!   exercised, checked result by result and, after every transaction, state by state.
//!
//! A backend's tests wire everything with one line:
//!
//! ```ignore
//! carmine_store::conformance_tests!(
//!     make_store: MemStore::new(MemStoreConfig::default()),
//!     block_on: futures::executor::block_on,
//! );
//! ```
//!
//! `make_store` is evaluated afresh for every test and must give an empty store.

mod cases;
mod random;

pub use cases::*;
pub use random::{
    arb_op, arb_step, arb_transaction, check_random_transactions_against_model,
    check_steps_against_model, run_model_check, seed_from_env, Step,
};

use crate::{ObjectStore, StoreError};
use bytes::Bytes;
use carmine_types::limits::IO_LEN_MAX;
use carmine_types::CollectionId;
use std::collections::BTreeMap;

/// Expands to one `#[test]` per conformance case plus the randomised model comparison.
///
/// `make_store` is an expression giving a fresh, empty store; `block_on` a path to a function
/// that runs a future to completion on the current thread.
#[macro_export]
macro_rules! conformance_tests {
    (make_store: $make:expr, block_on: $block_on:path $(,)?) => {
        $crate::__conformance_cases! { wire $make, $block_on }

        #[test]
        fn random_operations_match_the_reference_model() {
            $crate::conformance::run_model_check(256, 30, |steps| {
                $block_on($crate::conformance::check_steps_against_model(
                    &$make, steps,
                ))
            });
        }
    };
}

/// Expands the case list in a mode: `wire <make>, <block_on>` gives the tests, `names` an
/// array of the case names. Internal to [`conformance_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_apply {
    ((wire $make:expr, $block_on:path) $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let store = $make;
                $block_on($crate::conformance::$case(&store));
            }
        )*
    };
    ((names) $($case:ident),* $(,)?) => {
        [$(stringify!($case)),*]
    };
}

/// The single list of cases. A unit test checks it against every `pub async fn` in
/// `conformance/cases/`, so a new case cannot be left unwired.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($($mode:tt)*) => {
        $crate::__conformance_apply! { ($($mode)*)
            write_then_read_returns_same_bytes,
            unaligned_writes_across_pages_read_back,
            overwrite_changes_only_the_written_range,
            holes_read_as_zeros,
            read_len_zero_reads_to_end,
            read_at_end_of_object_is_short,
            read_past_end_returns_empty,
            readv_returns_each_extent,
            read_into_appends_exactly_what_read_returns,
            read_of_missing_object_is_not_found,
            read_in_missing_collection_is_collection_not_found,
            oversized_read_is_rejected,
            stat_reports_highest_written_byte,
            empty_write_creates_object_without_growing_it,
            touch_creates_empty_object_and_keeps_existing_data,
            zero_clears_range_and_extends_object,
            truncate_shrinks_and_zero_fills_on_regrow,
            truncate_extends_with_zeros,
            setters_create_missing_objects,
            remove_deletes_object_and_all_its_metadata,
            remove_of_missing_object_is_not_found,
            setattrs_and_getattr_round_trip,
            getattr_of_missing_attr_is_attr_not_found,
            rmattr_of_absent_attr_succeeds,
            removal_ops_need_an_existing_object,
            omap_set_get_and_remove_keys,
            omap_get_values_omits_missing_keys,
            omap_iterate_honours_start_after_and_limit,
            omap_header_round_trips_and_defaults_to_empty,
            omap_clear_removes_keys_and_header,
            clone_copies_data_attrs_and_omap,
            clone_is_independent_of_source_after_write,
            clone_replaces_existing_destination,
            clone_of_missing_source_is_not_found,
            clone_onto_itself_changes_nothing,
            clone_range_copies_bytes_to_offset,
            clone_range_zero_fills_past_source_end,
            clone_range_creates_destination,
            clone_range_within_one_object_handles_overlap,
            clone_range_of_missing_source_is_not_found,
            create_existing_collection_fails,
            remove_nonempty_collection_fails,
            remove_missing_collection_is_not_found,
            collections_are_listed_in_order,
            ops_in_missing_collection_fail,
            removed_collection_can_be_recreated_empty,
            list_objects_pages_in_order,
            list_objects_in_missing_collection_is_not_found,
            zero_listing_limit_is_rejected,
            failed_transaction_leaves_no_trace,
            failed_transaction_restores_removed_objects_and_collections,
            later_ops_see_earlier_ops_of_the_same_transaction,
            empty_transaction_succeeds,
            oversized_name_is_rejected,
            empty_names_are_rejected,
            oversized_values_are_rejected,
            offset_overflow_is_rejected,
            extent_beyond_max_object_size_is_rejected,
            statfs_counts_objects,
            flush_succeeds,
            compare_that_holds_lets_the_transaction_apply,
            failed_compare_changes_nothing,
            missing_object_compares_as_having_no_attrs_or_keys,
            compare_after_another_op_is_rejected,
        }
    };
}

/// Everything observable about one object, read back through the trait.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ObjectDump {
    pub size: u64,
    pub data: Vec<u8>,
    pub attrs: BTreeMap<String, Bytes>,
    pub omap_header: Bytes,
    pub omap: BTreeMap<Bytes, Bytes>,
}

/// Everything observable about a store, read back through the trait.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StoreDump {
    pub collections: BTreeMap<CollectionId, BTreeMap<String, ObjectDump>>,
    /// `statfs().objects`.
    pub objects: u64,
}

fn ok<T>(what: &str, r: Result<T, StoreError>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Reads the whole store back. Listings are paged three at a time so their paging is
/// exercised on every dump, and each page is checked for order, size and `next`.
pub async fn dump<S: ObjectStore>(store: &S) -> StoreDump {
    const PAGE: usize = 3;
    let mut out = StoreDump {
        objects: store.statfs().objects,
        ..Default::default()
    };
    let cids = ok("list_collections", store.list_collections().await);
    assert!(
        cids.windows(2).all(|w| w[0] < w[1]),
        "collections not in order: {cids:?}"
    );
    for cid in cids {
        assert!(
            ok("collection_exists", store.collection_exists(cid).await),
            "listed {cid} does not exist"
        );
        let mut names = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = ok(
                "list_objects",
                store.list_objects(cid, after.as_deref(), PAGE).await,
            );
            check_page(
                &page.items,
                &page.next,
                PAGE,
                after.as_ref(),
                &format!("objects of {cid}"),
            );
            names.extend(page.items);
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let objects = out.collections.entry(cid).or_default();
        for oid in names {
            objects.insert(oid.clone(), dump_object(store, cid, &oid).await);
        }
    }
    out
}

/// Checks one listing page: keys strictly increasing and after `after`, no more than `limit`,
/// and `next`, when set, equal to the last key of a full page.
fn check_page<K: Ord + std::fmt::Debug, T: PageKey<K>>(
    items: &[T],
    next: &Option<K>,
    limit: usize,
    after: Option<&K>,
    what: &str,
) {
    assert!(
        items.len() <= limit,
        "{what}: {} items for limit {limit}",
        items.len()
    );
    let keys: Vec<&K> = items.iter().map(|i| i.key()).collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "{what}: not in order: {keys:?}"
    );
    if let (Some(after), Some(first)) = (after, keys.first()) {
        assert!(*first > after, "{what}: {first:?} not after {after:?}");
    }
    if let Some(next) = next {
        assert_eq!(items.len(), limit, "{what}: next set on a short page");
        assert_eq!(Some(&next), keys.last(), "{what}: next is not the last key");
    }
}

trait PageKey<K> {
    fn key(&self) -> &K;
}
impl PageKey<String> for String {
    fn key(&self) -> &String {
        self
    }
}
impl PageKey<Bytes> for (Bytes, Bytes) {
    fn key(&self) -> &Bytes {
        &self.0
    }
}

/// Reads one object back, data in `IO_LEN_MAX` chunks and omap three entries at a time.
pub async fn dump_object<S: ObjectStore>(store: &S, cid: CollectionId, oid: &str) -> ObjectDump {
    const PAGE: usize = 3;
    let what = format!("{cid}/{oid}");
    let size = ok(&what, store.stat(cid, oid).await).size;
    let mut data = Vec::new();
    while (data.len() as u64) < size {
        let chunk = (size - data.len() as u64).min(IO_LEN_MAX as u64);
        let bytes = ok(&what, store.read(cid, oid, data.len() as u64, chunk).await);
        assert_eq!(
            bytes.len() as u64,
            chunk,
            "{what}: short read inside the object"
        );
        data.extend_from_slice(&bytes);
    }
    let mut omap = BTreeMap::new();
    let mut after: Option<Bytes> = None;
    loop {
        let page = ok(
            &what,
            store.omap_iterate(cid, oid, after.as_deref(), PAGE).await,
        );
        check_page(
            &page.items,
            &page.next,
            PAGE,
            after.as_ref(),
            &format!("omap of {what}"),
        );
        omap.extend(page.items);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    ObjectDump {
        size,
        data,
        attrs: ok(&what, store.getattrs(cid, oid).await),
        omap_header: ok(&what, store.omap_get_header(cid, oid).await),
        omap,
    }
}

/// The first difference between two dumps, described briefly (object data can be large), or
/// `None` when they are equal.
pub fn diff(left: &StoreDump, right: &StoreDump) -> Option<String> {
    let lc: Vec<_> = left.collections.keys().collect();
    let rc: Vec<_> = right.collections.keys().collect();
    if lc != rc {
        return Some(format!("collections {lc:?} vs {rc:?}"));
    }
    for (cid, lobjs) in &left.collections {
        let robjs = &right.collections[cid];
        let ln: Vec<_> = lobjs.keys().collect();
        let rn: Vec<_> = robjs.keys().collect();
        if ln != rn {
            return Some(format!("objects of {cid}: {ln:?} vs {rn:?}"));
        }
        for (oid, l) in lobjs {
            let r = &robjs[oid];
            let at = format!("{cid}/{oid}");
            if l.size != r.size {
                return Some(format!("{at}: size {} vs {}", l.size, r.size));
            }
            if let Some(i) = l.data.iter().zip(&r.data).position(|(a, b)| a != b) {
                return Some(format!(
                    "{at}: data differs first at byte {i}: {} vs {}",
                    l.data[i], r.data[i]
                ));
            }
            if l.attrs != r.attrs {
                return Some(format!("{at}: xattrs {:?} vs {:?}", l.attrs, r.attrs));
            }
            if l.omap_header != r.omap_header {
                return Some(format!(
                    "{at}: omap header {:?} vs {:?}",
                    l.omap_header, r.omap_header
                ));
            }
            if l.omap != r.omap {
                return Some(format!("{at}: omap {:?} vs {:?}", l.omap, r.omap));
            }
        }
    }
    if left.objects != right.objects {
        return Some(format!(
            "statfs objects {} vs {}",
            left.objects, right.objects
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_case_is_wired_into_the_macro() {
        let wired = crate::__conformance_cases! { names };
        let defined: Vec<&str> = super::cases::SOURCES
            .iter()
            .flat_map(|source| source.lines())
            .filter_map(|line| line.strip_prefix("pub async fn "))
            .map(|rest| rest.split('<').next().unwrap())
            .collect();
        let mut wired_sorted = wired.to_vec();
        wired_sorted.sort_unstable();
        let mut defined_sorted = defined.clone();
        defined_sorted.sort_unstable();
        assert_eq!(
            wired_sorted, defined_sorted,
            "cases defined vs wired differ"
        );
    }
}
