//! Pools the map no longer has (`carmine pool rm`): each reactor deletes what it holds of
//! them — its copies' PG state records, their objects and collections — in the background,
//! after a map that removed a pool and at start (an OSD that was down when a pool went
//! still holds it). Pool ids are never given twice (`OsdMap::highest_pool_id`), so nothing
//! of a removed pool is ever taken for a new pool's. A deletion cut short (a crash, a store
//! error) is finished by the next sweep: at the next map that removes a pool, or the next
//! start.

use crate::reactor::Shard;
use carmine_store::{ObjectStore, StoreErrorKind, Transaction};
use carmine_types::PgId;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::rc::Rc;

/// Objects removed per transaction.
const BATCH: usize = 256;
/// Passes over a PG whose collection still held objects when it was to go: a client write
/// to a pool of one copy that began before the map came may store its object after the
/// listing.
const PASSES_MAX: u32 = 3;

/// Whether a sweep runs on this reactor, and whether another was asked for meanwhile.
#[derive(Default)]
pub(crate) struct Sweeps {
    running: Cell<bool>,
    again: Cell<bool>,
}

/// Starts a sweep of removed pools, or asks the one running for another pass.
pub(crate) fn start<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>) {
    let sweeps = &shard.removed_pools;
    if sweeps.running.replace(true) {
        sweeps.again.set(true);
        return;
    }
    let shard = shard.clone();
    carmine_reactor::spawn(async move {
        loop {
            shard.removed_pools.again.set(false);
            match pass(&shard).await {
                Ok(0) => {}
                Ok(pgs) => tracing::info!(pgs, "PGs of removed pools deleted from this store"),
                // Left for the next sweep: nothing of a removed pool is ever read again.
                Err(why) => {
                    tracing::warn!("deleting what this store holds of removed pools: {why}")
                }
            }
            if !shard.removed_pools.again.get() {
                break;
            }
        }
        shard.removed_pools.running.set(false);
    })
    .detach();
}

/// One pass: stops this reactor's copies of removed pools' PGs, then deletes every PG of a
/// removed pool the store holds. Returns how many it deleted.
async fn pass<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>) -> Result<usize, String> {
    let mut pgs: BTreeSet<PgId> = crate::replication::retire_removed(shard)
        .await
        .into_iter()
        .collect();
    let map = shard.view.borrow().map.clone();
    let collections = shard
        .store
        .list_collections()
        .await
        .map_err(|e| format!("listing collections: {e}"))?;
    pgs.extend(
        collections
            .into_iter()
            .filter(|c| *c != crate::fence::META_COLLECTION && map.pool_removed(c.pool)),
    );
    for pg in &pgs {
        delete_pg(&shard.store, *pg).await?;
    }
    Ok(pgs.len())
}

/// Deletes `pg`'s state record, then its objects, then its collection. The record goes
/// first: a copy cut short leaves only a collection, which the next sweep finds.
async fn delete_pg<S: ObjectStore>(store: &S, pg: PgId) -> Result<(), String> {
    let meta = crate::replication::meta_oid(pg);
    let mut txn = Transaction::new();
    txn.touch(crate::fence::META_COLLECTION, &meta)
        .remove(crate::fence::META_COLLECTION, &meta);
    store
        .submit(txn)
        .await
        .map_err(|e| format!("removing the state of PG {pg}: {e}"))?;
    let mut removed = 0;
    for _ in 0..PASSES_MAX {
        loop {
            let page = match store.list_objects(pg, None, BATCH).await {
                Ok(p) => p,
                Err(e) if e.kind == StoreErrorKind::CollectionNotFound => return Ok(()),
                Err(e) => return Err(format!("listing PG {pg}: {e}")),
            };
            if page.items.is_empty() {
                break;
            }
            let mut txn = Transaction::with_capacity(page.items.len());
            for oid in &page.items {
                txn.remove(pg, oid);
            }
            store
                .submit(txn)
                .await
                .map_err(|e| format!("removing objects of PG {pg}: {e}"))?;
            removed += page.items.len();
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
