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
            // A whole history replaces every write queued before it (a removal stays: the
            // history must be taken after it).
            if let Some(i) = q.iter().rposition(|j| matches!(j, Job::History { .. })) {
                let kept: Vec<Job> = q.drain(..i).filter(|j| matches!(j, Job::Purge)).collect();
                for j in kept.into_iter().rev() {
                    q.push_front(j);
                }
            }
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

fn superseded(pgr: &PgReplica) -> bool {
    pgr.jobs
        .borrow()
        .iter()
        .any(|j| matches!(j, Job::History { .. } | Job::Purge))
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
    for (oid, v) in missing {
        let Some(from) = source else {
            // The primary's own history won: it cannot lack its own objects.
            tracing::error!(%pg, oid, version = %v, "object missing and no member to copy it from");
            continue;
        };
        let copy = loop {
            if superseded(pgr) || pgr.broken.borrow().is_some() {
                return Ok(Done::Superseded);
            }
            match pull::fetch(shard, pg, from, &oid).await {
                // (The sender's version is its own view; this copy is labelled `v`, the
                // version the history wants: the source's log won, so they agree.)
                Some((_, copy)) => break copy,
                None => carmine_reactor::sleep(PULL_RETRY).await,
            }
        };
        let mut txn = Transaction::new();
        // Whatever this copy held of it goes (touch first: removing needs an object).
        txn.touch(pg, &oid).remove(pg, &oid);
        if let Some(c) = copy {
            install(&mut txn, pg, &oid, c);
        }
        shard
            .store
            .submit(txn)
            .await
            .map_err(|e| format!("storing recovered object {oid:?}: {e}"))?;
        pgr.held.borrow_mut().insert(oid, v);
    }
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
