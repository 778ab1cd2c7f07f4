//! Pools the map no longer has (`carmine pool rm`): each reactor deletes what it holds of
//! them — its copies' PG state records, their objects and collections — in the background,
//! after a map that removed a pool and at start (an OSD that was down when a pool went
//! still holds it). Pool ids are never given twice (`OsdMap::highest_pool_id`), so nothing
//! of a removed pool is ever taken for a new pool's. A PG whose deletion failed (a store
//! error) is tried again after a pause that doubles up to [`RETRY_MAX`]; one cut short by a
//! crash, at the next start.

use crate::reactor::Shard;
use carmine_store::{ObjectStore, StoreErrorKind, Transaction};
use carmine_types::PgId;
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

/// Passes over a PG whose collection still held objects when it was to go: a client write
/// to a pool of one copy that began before the map came may store its object after the
/// listing.
const PASSES_MAX: u32 = 3;
/// The first pause before a sweep that failed is tried again, and the longest.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// Whether a sweep runs on this reactor, and whether another was asked for meanwhile.
#[derive(Default)]
pub(crate) struct Sweeps {
    running: Cell<bool>,
    again: Cell<bool>,
    /// Removed pools whose PG histories this reactor still has to ask the map store's
    /// worker to forget (its copies stopped; the ask was refused or failed).
    forget: RefCell<BTreeSet<u32>>,
}

/// The map store failed to forget `pool`'s histories: asked again by a sweep after a pause
/// (the store may be down).
pub(crate) fn forget_failed<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pool: u32) {
    shard.removed_pools.forget.borrow_mut().insert(pool);
    let weak = Rc::downgrade(shard);
    carmine_reactor::spawn(async move {
        carmine_reactor::sleep(RETRY_FIRST).await;
        if let Some(shard) = weak.upgrade() {
            start(&shard);
        }
    })
    .detach();
}

/// Starts a sweep of removed pools, or asks the one running for another pass.
pub(crate) fn start<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>) {
    let sweeps = &shard.removed_pools;
    if sweeps.running.replace(true) {
        sweeps.again.set(true);
        return;
    }
    // Weak between passes: a pause must not keep a stopped reactor's shard alive.
    let weak = Rc::downgrade(shard);
    carmine_reactor::spawn(async move {
        let mut pause = RETRY_FIRST;
        loop {
            let Some(shard) = weak.upgrade() else { return };
            shard.removed_pools.again.set(false);
            let (deleted, failed) = pass(&shard).await;
            if deleted > 0 {
                tracing::info!(deleted, "PGs of removed pools deleted from this store");
            }
            if !failed && !shard.removed_pools.again.get() {
                shard.removed_pools.running.set(false);
                return;
            }
            drop(shard);
            if failed {
                // Nothing of a removed pool is ever read again: it can wait.
                tracing::warn!(
                    retry_in_s = pause.as_secs(),
                    "some PGs of removed pools are left"
                );
                carmine_reactor::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    })
    .detach();
}

/// One pass by the map of now: stops this reactor's copies of removed pools' PGs, then
/// deletes every PG of a removed pool the store holds. Returns how many it deleted, and
/// whether any failed.
async fn pass<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>) -> (usize, bool) {
    let map = shard.view.borrow().map.clone();
    let mut pgs: BTreeSet<PgId> = crate::replication::retire_removed(shard, &map)
        .await
        .into_iter()
        .collect();
    // The copies stopped: what they recorded in the map store can go. (`pool rm` removed
    // the histories already; a primary that had not heard of it yet may have recorded one
    // since, and only this reactor's copies could.)
    let forget: Vec<u32> = {
        let mut f = shard.removed_pools.forget.borrow_mut();
        f.extend(pgs.iter().map(|pg| pg.pool));
        f.iter().copied().collect()
    };
    let mut failed = false;
    for pool in forget {
        if crate::replication::forget_pool_histories(shard, pool) {
            shard.removed_pools.forget.borrow_mut().remove(&pool);
        } else {
            failed = true;
        }
    }
    match shard.store.list_collections().await {
        Ok(collections) => pgs.extend(
            collections
                .into_iter()
                .filter(|c| *c != crate::fence::META_COLLECTION && map.pool_removed(c.pool)),
        ),
        Err(e) => {
            tracing::warn!("listing collections to delete removed pools' PGs: {e}");
            return (0, true);
        }
    }
    let mut deleted = 0;
    for pg in &pgs {
        match delete_pg(&shard.store, *pg).await {
            Ok(()) => deleted += 1,
            Err(why) => {
                tracing::warn!(%pg, "deleting a PG of a removed pool: {why}");
                failed = true;
            }
        }
    }
    (deleted, failed)
}

/// Deletes `pg`'s state record, then its objects, then its collection. The record goes
/// first: a copy cut short leaves only a collection, which the next sweep finds.
async fn delete_pg<S: ObjectStore>(store: &S, pg: PgId) -> Result<(), String> {
    let mut removed = 0;
    for _ in 0..PASSES_MAX {
        match crate::replication::remove_state_and_objects(store, pg).await {
            Ok(n) => removed += n,
            Err(e) if e.kind == StoreErrorKind::CollectionNotFound => return Ok(()),
            Err(e) => return Err(format!("deleting PG {pg}: {e}")),
        }
        let mut txn = Transaction::new();
        txn.remove_collection(pg);
        match store.submit(txn).await {
            Ok(()) => {
                tracing::debug!(%pg, removed, "PG of a removed pool deleted");
                return Ok(());
            }
            Err(e) if e.kind == StoreErrorKind::CollectionNotEmpty => continue,
            Err(e) if e.kind == StoreErrorKind::CollectionNotFound => return Ok(()),
            Err(e) => return Err(format!("removing the collection of PG {pg}: {e}")),
        }
    }
    Err(format!(
        "PG {pg} still held objects after {PASSES_MAX} passes (writes still arriving)"
    ))
}
