//! Stray copies: once a PG is clean on an acting set without this OSD (it was moved by an
//! added OSD, a reweight or an `osd out`), the copy left here is removed, so space follows
//! placement. Clean means the PG's recorded history settled to one interval whose acting set
//! has every copy the pool keeps, and the map agrees: that interval went active only once each
//! of its members had every acknowledged write durable, so nothing here is needed any more.
//!
//! The member forgets the PG at once (it answers any primary's query as a member with
//! nothing), and the store removal goes through the PG's persist queue, so that if the PG
//! comes back here before the removal ends, its new history is taken only after it. The PG's
//! state record goes first: a crash part-way leaves only objects no state names, which a
//! later backfill overwrites and a scrub reports as stray.

use super::{feed_map, Job, PgReplica};
use crate::reactor::Shard;
use carmine_pg::{Interval, Member};
use carmine_store::{ObjectStore, StoreError, Transaction};
use carmine_types::PgId;
use std::rc::Rc;

/// Objects removed per transaction.
const BATCH: usize = 256;

/// True if this member has anything stored for its PG: objects, a log, or the record of an
/// activation (every copy that went active has a state record, empty PG or not).
pub(super) fn holds_state(m: &Member) -> bool {
    m.les > 0
        || !m.objects.is_empty()
        || !m.missing.is_empty()
        || m.log.head() != carmine_pg::Version::ZERO
}

/// True if `pgr`'s copy is a stray that the history `history` (just read from the map store)
/// shows is no longer needed.
fn removable<S>(shard: &Shard<S>, pgr: &PgReplica, history: &[Interval]) -> bool {
    let view = shard.view.borrow();
    let Ok(pool) = view.map.pool(pgr.pg.pool) else {
        return false;
    };
    let acting = view.map.pg_osds(pgr.pg, pool.size);
    let m = pgr.member.borrow();
    holds_state(&m)
        && m.epoch() == view.map.epoch
        && !m.acting().contains(&shard.osd)
        && !acting.contains(&shard.osd)
        // A backfill target keeps what it holds: it acts again once the temporary set goes
        // (placement, not the up set: one held down on reports a moment is one still).
        && !view.map.pg_placement(pgr.pg, pool.size).contains(&shard.osd)
        && acting.len() == pool.size as usize
        && matches!(history, [i] if i.acting == acting && i.epoch <= view.map.epoch)
}

/// Removes `pgr`'s copy if `history` shows it is a stray no longer needed.
pub(crate) fn consider<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    history: &[Interval],
) {
    if pgr.broken.borrow().is_some() || !removable(shard, pgr, history) {
        return;
    }
    let objects = pgr.held.borrow().len();
    tracing::info!(pg = %pgr.pg, objects, "removing the stray copy of a PG that is clean elsewhere");
    let fresh = shard.replication.new_member().succeed(&pgr.member.borrow());
    *pgr.member.borrow_mut() = fresh;
    pgr.held.borrow_mut().clear();
    pgr.log_keys.borrow_mut().clear();
    pgr.stored_meta.set(None);
    pgr.inflight_ops.borrow_mut().clear();
    let map = shard.view.borrow().map.clone();
    feed_map(shard, pgr, &map);
    super::queue_job(shard, pgr, Job::Purge);
}

/// Removes the PG's state record, then every object of its collection.
pub(super) async fn run<S: ObjectStore>(shard: &Shard<S>, pgr: &PgReplica) -> Result<(), String> {
    let pg = pgr.pg;
    let removed = remove_state_and_objects(&shard.store, pg)
        .await
        .map_err(|e| format!("removing the stray PG: {e}"))?;
    // Jobs of the removed member queued before this one ran first and noted what they
    // stored; none of it is here any more (jobs queued after this one run after it).
    pgr.held.borrow_mut().clear();
    pgr.log_keys.borrow_mut().clear();
    pgr.stored_meta.set(None);
    tracing::info!(%pg, removed, "stray copy removed");
    Ok(())
}

/// Removes `pg`'s state record, then every object of its collection, `BATCH` per
/// transaction; returns how many objects. The record goes first: a removal cut short leaves
/// only objects no state names. (Also what deletes the PGs of removed pools.)
pub(crate) async fn remove_state_and_objects<S: ObjectStore>(
    store: &S,
    pg: PgId,
) -> Result<usize, StoreError> {
    let mut txn = Transaction::new();
    let meta = super::layout::meta_oid(pg);
    txn.touch(crate::fence::META_COLLECTION, &meta)
        .remove(crate::fence::META_COLLECTION, &meta);
    store.submit(txn).await?;
    let mut removed = 0;
    loop {
        let page = store.list_objects(pg, None, BATCH).await?;
        if page.items.is_empty() {
            return Ok(removed);
        }
        let mut txn = Transaction::with_capacity(page.items.len());
        for oid in &page.items {
            txn.remove(pg, oid);
        }
        store.submit(txn).await?;
        removed += page.items.len();
    }
}
