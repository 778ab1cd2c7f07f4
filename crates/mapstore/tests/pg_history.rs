//! PG histories (decision 0009) on both backends: appended only after the interval the caller
//! saw, one winner when primaries race, damaged records reported and never overwritten.

use carmine_mapstore::etcd_client::{Etcd, Put};
use carmine_mapstore::{EtcdPgHistory, LocalPgHistory, MapStoreError, PgHistoryStore, Recorded};
use carmine_pg::Interval;
use carmine_types::PgId;
use std::sync::Arc;

const PG: PgId = PgId { pool: 1, seed: 7 };

mod common;
use common::TestDir;

struct Backend {
    store: Arc<dyn PgHistoryStore + Send + Sync>,
    /// Writes garbage where the PG's history is.
    damage: Box<dyn Fn()>,
    _dir: TestDir,
}

fn local(name: &str) -> Backend {
    let dir = TestDir::new("pghist-local", name);
    let file = dir.dir.join("pg-history").join("1.7");
    Backend {
        store: Arc::new(LocalPgHistory::new(&dir.dir)),
        damage: Box::new(move || {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, b"not a history").unwrap();
        }),
        _dir: dir,
    }
}

fn etcd(name: &str) -> Backend {
    let dir = TestDir::with_etcd("pghist-etcd", name);
    let client = Etcd::new(&[dir.endpoint()]).unwrap();
    let raw = client.clone();
    Backend {
        store: Arc::new(EtcdPgHistory::new(client, "c")),
        damage: Box::new(move || {
            let key = carmine_mapstore::keys::pg_history("c", PG);
            let put = Put::Put {
                key: &key,
                value: b"not a history",
                lease: 0,
            };
            assert!(raw.txn(&[], &[put]).unwrap());
        }),
        _dir: dir,
    }
}

fn iv(epoch: u32, acting: &[u32]) -> Interval {
    Interval {
        epoch,
        acting: acting.to_vec(),
    }
}

fn epochs(b: &Backend) -> Vec<u32> {
    b.store
        .get(PG)
        .unwrap()
        .intervals
        .iter()
        .map(|i| i.epoch)
        .collect()
}

fn appends_only_after_the_interval_the_caller_saw(b: &Backend) {
    assert!(b.store.get(PG).unwrap().intervals.is_empty());
    assert_eq!(
        b.store.record(PG, None, iv(3, &[0, 1])).unwrap(),
        Recorded::Done
    );
    // A primary that read an empty history is told what is there now.
    match b.store.record(PG, None, iv(4, &[1, 2])).unwrap() {
        Recorded::Changed(h) => assert_eq!(h.intervals, vec![iv(3, &[0, 1])]),
        Recorded::Done => panic!("recorded over an interval it did not see"),
    }
    // Not newer than the last: refused too.
    assert!(matches!(
        b.store.record(PG, Some(3), iv(3, &[2])).unwrap(),
        Recorded::Changed(_)
    ));
    assert_eq!(
        b.store.record(PG, Some(3), iv(4, &[1, 2])).unwrap(),
        Recorded::Done
    );
    assert_eq!(epochs(b), vec![3, 4]);
    // Other PGs are separate.
    let other = PgId { pool: 1, seed: 8 };
    assert!(b.store.get(other).unwrap().intervals.is_empty());
    assert!(
        b.store.record(PG, Some(4), iv(5, &[1, 1])).is_err(),
        "an OSD twice"
    );
}

fn racing_primaries_never_both_record_after_the_same_interval(b: &Backend) {
    assert_eq!(
        b.store.record(PG, None, iv(1, &[0])).unwrap(),
        Recorded::Done
    );
    let wins: Vec<u32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6u32)
            .map(|k| {
                let store = b.store.clone();
                s.spawn(move || {
                    let epoch = 10 + k;
                    match store.record(PG, Some(1), iv(epoch, &[k % 4])).unwrap() {
                        Recorded::Done => Some(epoch),
                        Recorded::Changed(h) => {
                            assert!(h.last_epoch() > Some(1), "refused on an unchanged history");
                            None
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(
        wins.len(),
        1,
        "exactly one primary records after epoch 1: {wins:?}"
    );
    assert_eq!(epochs(b), vec![1, wins[0]]);
}

fn a_damaged_history_is_reported_and_never_overwritten(b: &Backend) {
    (b.damage)();
    assert!(matches!(
        b.store.get(PG),
        Err(MapStoreError::DamagedHistory { .. })
    ));
    assert!(matches!(
        b.store.record(PG, None, iv(2, &[0])),
        Err(MapStoreError::DamagedHistory { .. })
    ));
    assert!(matches!(
        b.store.get(PG),
        Err(MapStoreError::DamagedHistory { .. })
    ));
}

fn settles_to_the_newest_interval_if_it_is_the_callers(b: &Backend) {
    for (after, i) in [(None, iv(3, &[0, 1])), (Some(3), iv(5, &[1, 2]))] {
        assert_eq!(b.store.record(PG, after, i).unwrap(), Recorded::Done);
    }
    // A primary whose interval began in 6: the newest (5) is not its own.
    assert!(!b.store.settle(PG, 6, 9).unwrap());
    // One clean in 4 (interval from 2) whose map is behind the newest (5): not its own.
    assert!(!b.store.settle(PG, 2, 4).unwrap());
    assert_eq!(epochs(b), vec![3, 5]);
    // The primary that recorded 5, clean in 8 after epochs that kept its acting set.
    assert!(b.store.settle(PG, 4, 8).unwrap());
    assert_eq!(epochs(b), vec![5]);
    // Nothing left to drop.
    assert!(!b.store.settle(PG, 4, 8).unwrap());
}

fn removing_a_pool_forgets_its_histories_and_no_other(b: &Backend) {
    // Pool 1 (PG 1.7 and 1.8), pool 11 (whose key and file names start with "1" too), pool 2.
    let pgs = [
        PG,
        PgId { pool: 1, seed: 8 },
        PgId { pool: 11, seed: 7 },
        PgId { pool: 2, seed: 0 },
    ];
    for pg in pgs {
        assert_eq!(
            b.store.record(pg, None, iv(3, &[0])).unwrap(),
            Recorded::Done
        );
    }
    assert_eq!(b.store.remove_pool(1).unwrap(), 2);
    assert!(b.store.get(PG).unwrap().intervals.is_empty());
    assert!(b.store.get(pgs[1]).unwrap().intervals.is_empty());
    for pg in &pgs[2..] {
        assert_eq!(
            b.store.get(*pg).unwrap().intervals,
            vec![iv(3, &[0])],
            "{pg}"
        );
    }
    assert_eq!(b.store.remove_pool(1).unwrap(), 0, "nothing left");
    assert_eq!(b.store.remove_pool(7).unwrap(), 0, "a pool with none");
    // A PG of the removed pool may be recorded again (a primary that had not heard): it is
    // a key like any other, removed by the next pass.
    assert_eq!(
        b.store.record(PG, None, iv(5, &[1])).unwrap(),
        Recorded::Done
    );
    assert_eq!(b.store.remove_pool(1).unwrap(), 1);
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod local_backend {
            $(#[test] fn $case() { super::$case(&super::local(stringify!($case))); })*
        }
        mod etcd_backend {
            $(#[test] fn $case() { super::$case(&super::etcd(stringify!($case))); })*
        }
    };
}

conformance!(
    appends_only_after_the_interval_the_caller_saw,
    racing_primaries_never_both_record_after_the_same_interval,
    a_damaged_history_is_reported_and_never_overwritten,
    settles_to_the_newest_interval_if_it_is_the_callers,
    removing_a_pool_forgets_its_histories_and_no_other,
);
