//! Writing a member's changes to the store, in the order the member asked for them: one task
//! per PG while it has changes queued. Consecutive writes go in one transaction (a group
//! commit per PG: a burst of replica writes costs one store commit); a whole history taken at
//! activation first copies the objects this copy lacks from the member that has them, then
//! replaces the PG's state in one transaction. The member hears `Persisted` only once the
//! store says durable, so nothing is acknowledged before it is.

use super::{drive, fail, layout, pull, Job, PgReplica};
use crate::reactor::Shard;
use carmine_pg::{Event, OpKind, Version};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::OsdId;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

/// Pause between attempts to pull an object from a member that did not answer.
const PULL_RETRY: Duration = Duration::from_millis(200);

enum Done {
    /// Everything up to this persist is durable.
    Persisted(u64),
    /// Nothing for the member to hear: a newer whole history was queued meanwhile (this one
    /// was abandoned for it), or a stray copy was removed.
    Superseded,
}

pub(super) async fn run<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pgr: &Rc<PgReplica>) {
    loop {
        let batch: Vec<Job> = {
            let mut q = pgr.jobs.borrow_mut();
            if q.is_empty() || pgr.broken.borrow().is_some() {
                pgr.persisting.set(false);
                return;
            }
            // Strictly in order. A history must not drop the writes queued before it: the
            // history it describes may hold them (a write in flight when the interval ended
            // is in the log the new primary took), and their data exists nowhere else.
            let alone = |j: &Job| matches!(j, Job::History { .. } | Job::Purge);
            if q.front().is_some_and(alone) {
                q.pop_front().into_iter().collect()
            } else {
                let n = q.iter().position(alone).unwrap_or(q.len());
                q.drain(..n).collect()
            }
        };
        let mut batch = batch.into_iter();
        let result = match batch.next() {
            Some(Job::History {
                seq,
                log,
                objects,
                les,
                source,
            }) => take_history(shard, pgr, seq, log, objects, les, source).await,
            Some(Job::Purge) => super::purge::run(shard, pgr)
                .await
                .map(|()| Done::Superseded),
            Some(first) => entries(shard, pgr, std::iter::once(first).chain(batch).collect()).await,
            None => continue,
        };
        match result {
            Ok(Done::Persisted(seq)) => drive(shard, pgr, Event::Persisted { seq }, None),
            Ok(Done::Superseded) => {}
            Err(why) => {
                fail(pgr, why);
                pgr.persisting.set(false);
                return;
            }
        }
    }
}

/// Writes, each with its log entry, in one transaction.
async fn entries<S: ObjectStore>(
    shard: &Shard<S>,
    pgr: &PgReplica,
    jobs: Vec<Job>,
) -> Result<Done, String> {
    let pg = pgr.pg;
    let mut txn = Transaction::new();
    let mut last = 0;
    let mut span = None;
    let mut changed: Vec<(String, Option<Version>)> = Vec::new();
    {
        // Updated as we go (a failed transaction stops this copy); never held across the
        // store's await.
        let mut keys = pgr.log_keys.borrow_mut();
        for job in jobs {
            match job {
                Job::Applied { seq } => last = last.max(seq),
                Job::Entry {
                    seq,
                    entry,
                    ops,
                    tail,
                    les,
                } => {
                    crate::handler::add_ops(&mut txn, pg, &entry.oid, ops)
                        .map_err(|e| format!("write {}: {}", entry.version, e.message))?;
                    keys.push_back(entry.version);
                    let mut trimmed = Vec::new();
                    while keys.front().is_some_and(|v| *v <= tail) {
                        trimmed.push(layout::log_key(keys.pop_front().expect("front")));
                    }
                    layout::add_entry(&mut txn, pg, &entry, trimmed);
                    changed.push((
                        entry.oid.clone(),
                        (entry.kind == OpKind::Modify).then_some(entry.version),
                    ));
                    span = Some((tail, entry.version, les));
                    last = last.max(seq);
                }
                Job::History { .. } | Job::Purge => unreachable!("taken alone"),
            }
        }
    }
    if let Some((tail, head, les)) = span {
        layout::set_meta(&mut txn, pg, tail, head, les);
        shard
            .store
            .submit(txn)
            .await
            .map_err(|e| format!("storing writes: {e}"))?;
        let mut held = pgr.held.borrow_mut();
        for (oid, v) in changed {
            match v {
                Some(v) => held.insert(oid, v),
                None => held.remove(&oid),
            };
        }
    }
    Ok(Done::Persisted(last))
}

/// A history being taken may be abandoned for the next one only if nothing else is queued
/// before it: a write queued between them was made on top of the first.
fn superseded(pgr: &PgReplica) -> bool {
    pgr.jobs
        .borrow()
        .front()
        .is_some_and(|j| matches!(j, Job::History { .. } | Job::Purge))
}

/// Makes the store hold the history `log` and `objects` describe: objects whose version
/// differs from what is held come from `source`, objects no longer listed go.
async fn take_history<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &PgReplica,
    seq: u64,
    log: carmine_pg::PgLog,
    objects: BTreeMap<String, Version>,
    les: u32,
    source: Option<carmine_types::OsdId>,
) -> Result<Done, String> {
    let pg = pgr.pg;
    let missing: Vec<(String, Version)> = {
        let held = pgr.held.borrow();
        objects
            .iter()
            .filter(|(o, v)| held.get(*o) != Some(*v))
            .map(|(o, v)| (o.clone(), *v))
            .collect()
    };
    let gone: Vec<String> = pgr
        .held
        .borrow()
        .keys()
        .filter(|o| !objects.contains_key(*o))
        .cloned()
        .collect();
    if !missing.is_empty() {
        tracing::info!(%pg, objects = missing.len(), ?source, "recovering objects");
    }
    pgr.to_recover.set(missing.len() as u64);
    // Who may hold the objects: the member whose history won, then the one an earlier
    // history was being copied from (a primary that peers again within its epoch presents
    // the history it took as its own, before its copy of it is complete), then the others.
    if source.is_some() {
        pgr.last_source.set(source);
    }
    let mut candidates: Vec<OsdId> = source.into_iter().chain(pgr.last_source.get()).collect();
    for o in pgr.member.borrow().acting() {
        if *o != shard.osd && !candidates.contains(o) {
            candidates.push(*o);
        }
    }
    candidates.dedup();
    for (oid, v) in missing {
        let mut complained = false;
        let copy = 'found: loop {
            if superseded(pgr) || pgr.broken.borrow().is_some() {
                pgr.to_recover.set(0);
                return Ok(Done::Superseded);
            }
            for &from in &candidates {
                // Only a copy of that very version: a member may have taken the history
                // already and still be fetching the object itself.
                if let Some((held, Some(copy))) = pull::fetch(shard, pg, from, &oid).await {
                    if held == v {
                        break 'found copy;
                    }
                }
            }
            if !complained {
                complained = true;
                tracing::error!(%pg, oid, version = %v, ?candidates,
                    "no member sent this object at its version yet: the PG waits for one");
            }
            carmine_reactor::sleep(PULL_RETRY).await;
        };
        let mut txn = Transaction::new();
        // Whatever this copy held of it goes (touch first: removing needs an object).
        txn.touch(pg, &oid).remove(pg, &oid);
        let bytes = copy.data.len() as u64;
        install(&mut txn, pg, &oid, copy);
        // The PG's state says which version the store now holds, in the same transaction: a
        // crash before the history is complete must not leave the object labelled with the
        // version it had before.
        layout::set_object_version(&mut txn, pg, &oid, Some(v));
        let stored = shard.store.submit(txn).await;
        if let Err(e) = stored {
            pgr.to_recover.set(0);
            return Err(format!("storing recovered object {oid:?}: {e}"));
        }
        pgr.held.borrow_mut().insert(oid, v);
        shard.metrics.recovered(bytes);
        pgr.to_recover.set(pgr.to_recover.get().saturating_sub(1));
    }
    pgr.to_recover.set(0);
    let mut txn = Transaction::new();
    for oid in &gone {
        txn.touch(pg, oid).remove(pg, oid);
    }
    layout::replace_all(&mut txn, pg, &log, &objects, les);
    shard
        .store
        .submit(txn)
        .await
        .map_err(|e| format!("storing the PG's history: {e}"))?;
    *pgr.held.borrow_mut() = objects;
    *pgr.log_keys.borrow_mut() = log.entries().map(|e| e.version).collect();
    Ok(Done::Persisted(seq))
}

/// Adds to `txn` the ops that recreate object `oid` as `c` describes.
pub(super) fn install(
    txn: &mut Transaction,
    pg: carmine_types::PgId,
    oid: &str,
    c: super::ObjectCopy,
) {
    txn.touch(pg, oid);
    if !c.data.is_empty() {
        txn.write(pg, oid, 0, c.data);
    }
    for (name, value) in c.attrs {
        txn.setattr(pg, oid, &name, value);
    }
    if !c.omap_header.is_empty() {
        txn.omap_set_header(pg, oid, c.omap_header);
    }
    if !c.omap.is_empty() {
        txn.omap_set(pg, oid, c.omap);
    }
}
