//! Writing a member's changes to the store, in the order the member asked for them: one task
//! per PG while it has changes queued. Consecutive writes go in one transaction (a group
//! commit per PG: a burst of replica writes costs one store commit); a whole history taken at
//! activation replaces the PG's state in one transaction, naming the objects this copy lacks
//! (recovered afterwards, in the background: `recover`), and a recovered object is stored with
//! the record that it is no longer missing. The member hears `Persisted` (or `Recovered`) only
//! once the store says durable, so nothing is acknowledged before it is.

use super::{drive, fail, layout, note_store_error, Job, PgReplica, Stored};
use crate::reactor::Shard;
use carmine_pg::{Event, OpKind, Version};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::OsdId;
use std::collections::BTreeMap;
use std::rc::Rc;

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
            let alone =
                |j: &Job| matches!(j, Job::History { .. } | Job::Purge | Job::Recovered { .. });
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
                missing,
                les,
                primary_run,
                source,
            }) => {
                let marks = layout::Marks { les, primary_run };
                take_history(shard, pgr, seq, log, objects, missing, marks, source).await
            }
            Some(Job::Recovered {
                oid,
                version,
                copy,
                done,
            }) => match store_recovered(shard, pgr, &oid, version, copy).await {
                Ok(stored) => {
                    match stored {
                        Stored::Yes => drive(shard, pgr, Event::Recovered { oid, version }, None),
                        // Overtaken by a write, perhaps: a backfill target says so.
                        Stored::NotWanted => {
                            drive(shard, pgr, Event::NotStored { oid, version }, None)
                        }
                        Stored::NoRoom => {}
                    }
                    let _ = done.send(stored);
                    continue;
                }
                Err(e) => Err(e),
            },
            Some(Job::Purge) => super::purge::run(shard, pgr)
                .await
                .map(|()| Done::Superseded),
            Some(first) => entries(shard, pgr, std::iter::once(first).chain(batch).collect()).await,
            None => continue,
        };
        match result {
            Ok(Done::Persisted(seq)) => {
                drive(shard, pgr, Event::Persisted { seq }, None);
                already_held(shard, pgr);
            }
            Ok(Done::Superseded) => {}
            Err(why) => {
                pgr.persisting.set(false);
                fail(shard, pgr, why);
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
                Job::Entry {
                    seq,
                    entry,
                    ops,
                    tail,
                    les,
                    lacking,
                } => {
                    let modify = entry.kind == OpKind::Modify;
                    if modify && lacking {
                        // The store lacks the object: the write's data would land on a stale
                        // copy, or none. The object stays missing, at this version, and is
                        // recovered whole. (The primary waits for its acting members to hold
                        // an object before it writes it; this is a backfill target, which
                        // takes every write while it fills, or a member that restarted and
                        // took its activation again meanwhile.)
                        tracing::debug!(%pg, oid = entry.oid, version = %entry.version,
                            "a write to an object this copy lacks: only its log entry is kept");
                    } else {
                        if !modify {
                            // Removing needs an object: this copy may lack it.
                            txn.touch(pg, &entry.oid);
                        }
                        crate::handler::add_ops(&mut txn, pg, &entry.oid, ops)
                            .map_err(|e| format!("write {}: {}", entry.version, e.message))?;
                    }
                    keys.push_back(entry.version);
                    layout::add_entry(&mut txn, pg, &entry, modify && lacking);
                    if !(modify && lacking) {
                        changed.push((entry.oid.clone(), modify.then_some(entry.version)));
                    }
                    span = Some((tail, entry.version, les));
                    last = last.max(seq);
                }
                Job::History { .. } | Job::Purge | Job::Recovered { .. } => {
                    unreachable!("taken alone")
                }
            }
        }
    }
    if let Some((tail, head, les)) = span {
        // The tail and les are stored when les moves, or once a batch of entries fell off the
        // tail (entries the member trimmed stay stored until then; they are true history).
        let meta = {
            let mut keys = pgr.log_keys.borrow_mut();
            let trimmable = keys.iter().take_while(|v| **v <= tail).count();
            let les_moved = pgr.stored_meta.get().is_none_or(|(_, l)| l != les);
            (les_moved || trimmable >= layout::TRIM_BATCH).then(|| {
                let trimmed = keys.drain(..trimmable).map(layout::log_key).collect();
                layout::trim(&mut txn, pg, trimmed);
                layout::set_meta(&mut txn, pg, tail, head, les);
                (tail, les)
            })
        };
        shard.store.submit(txn).await.map_err(|e| {
            note_store_error(shard, &e);
            format!("storing writes: {e}")
        })?;
        if meta.is_some() {
            pgr.stored_meta.set(meta);
        }
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

/// Makes the store hold the history `log` and `objects` describe: objects it no longer
/// lists go; those it names at a version the store does not hold (`missing`) are recorded as
/// such, and recovered afterwards.
#[allow(clippy::too_many_arguments)]
async fn take_history<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &PgReplica,
    seq: u64,
    log: carmine_pg::PgLog,
    objects: BTreeMap<String, Version>,
    missing: BTreeMap<String, Version>,
    marks: layout::Marks,
    source: Option<OsdId>,
) -> Result<Done, String> {
    let pg = pgr.pg;
    let held: BTreeMap<String, Version> = pgr
        .held
        .borrow()
        .iter()
        .filter(|(o, _)| objects.contains_key(*o))
        .map(|(o, v)| (o.clone(), *v))
        .collect();
    let gone: Vec<String> = pgr
        .held
        .borrow()
        .keys()
        .filter(|o| !objects.contains_key(*o))
        .cloned()
        .collect();
    // Held after all at the version named (the member did not know): not missing; the
    // member hears it once this is durable.
    let missing: BTreeMap<String, Version> = missing
        .into_iter()
        .filter(|(o, v)| held.get(o) != Some(v))
        .collect();
    // Every object the history names is held at that version, or missing.
    if let Some((o, _)) = objects
        .iter()
        .find(|(o, v)| held.get(*o) != Some(*v) && !missing.contains_key(*o))
    {
        return Err(format!(
            "the history taken names {o:?} at a version this copy neither holds nor lacks"
        ));
    }
    if !missing.is_empty() {
        tracing::info!(%pg, objects = missing.len(), ?source,
            "took the PG's history; recovering the objects this copy lacks in the background");
    }
    if source.is_some() {
        pgr.last_source.set(source);
    }
    let mut txn = Transaction::new();
    for oid in &gone {
        txn.touch(pg, oid).remove(pg, oid);
    }
    layout::replace_all(&mut txn, pg, &log, &held, &missing, marks);
    shard.store.submit(txn).await.map_err(|e| {
        note_store_error(shard, &e);
        format!("storing the PG's history: {e}")
    })?;
    *pgr.held.borrow_mut() = held;
    *pgr.log_keys.borrow_mut() = log.entries().map(|e| e.version).collect();
    pgr.stored_meta.set(Some((log.tail(), marks.les)));
    Ok(Done::Persisted(seq))
}

/// Objects the member lacks that the store holds at the very version needed (a history named
/// a version this copy had, but as missing): the member hears they are held.
fn already_held<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pgr: &Rc<PgReplica>) {
    let found: Vec<(String, Version)> = {
        let m = pgr.member.borrow();
        let held = pgr.held.borrow();
        match m.recoverable() {
            Some(missing) => missing
                .iter()
                .filter(|(o, v)| held.get(*o) == Some(*v))
                .map(|(o, v)| (o.clone(), *v))
                .collect(),
            None => Vec::new(),
        }
    };
    for (oid, version) in found {
        drive(shard, pgr, Event::Recovered { oid, version }, None);
    }
}

/// Stores a recovered object if the member still lacks it at that version: the object and
/// the record that it is held, in one transaction. A store without room for it changes
/// nothing (transactions apply whole or not at all): the object stays missing, and this copy
/// serves on.
async fn store_recovered<S: ObjectStore>(
    shard: &Shard<S>,
    pgr: &PgReplica,
    oid: &str,
    version: Version,
    copy: super::ObjectCopy,
) -> Result<Stored, String> {
    if pgr.member.borrow().missing.get(oid) != Some(&version) {
        return Ok(Stored::NotWanted);
    }
    let pg = pgr.pg;
    let mut txn = Transaction::new();
    // Whatever this copy held of it goes (touch first: removing needs an object).
    txn.touch(pg, oid).remove(pg, oid);
    install(&mut txn, pg, oid, copy);
    layout::set_recovered(&mut txn, pg, oid, version);
    match shard.store.submit(txn).await {
        Ok(()) => {}
        Err(e) if e.kind == carmine_store::StoreErrorKind::NoSpace => {
            note_store_error(shard, &e);
            tracing::warn!(pg = %pg, oid, %version,
                "no room to store a recovered object: it stays missing until room is freed");
            return Ok(Stored::NoRoom);
        }
        Err(e) => return Err(format!("storing recovered object {oid:?}: {e}")),
    }
    pgr.held.borrow_mut().insert(oid.to_string(), version);
    Ok(Stored::Yes)
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
