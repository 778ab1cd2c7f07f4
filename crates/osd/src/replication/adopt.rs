//! A pool of one copy given copies (`carmine pool set NAME --size N`): the OSD holding each of
//! its PGs takes the objects it stored without versions into the PG's versioned state before
//! the PG's first member starts here, so peering and backfill see them as the PG's history.
//!
//! The map writer recorded, before the map that gave the pool copies, each PG's first history:
//! one interval of the last one-copy epoch `e0` whose only member is the holder; the map names
//! the pool and `e0` (`OsdMap::given_copies`), and only such pools' PGs come here. The holder
//! that finds itself so named, with no state (objects or not), stores every object at version
//! `(e0, seq 1)` in run 0, an empty log whose tail and head are that version, and a last active
//! epoch of `e0`: its copy vouches for that interval, is authoritative against the empty new
//! copies (their heads are below its tail, so they are backfilled), and every write from now
//! on is newer. Any other OSD that finds objects without state in such a PG, whose history
//! names others, holds leftovers of a one-copy PG that moved away (`--allow-single-copy-moves`)
//! or of a purge cut short: they are deleted before its member starts, so they can never pass
//! for the PG's data. With no history at all they are left alone, and said.
//!
//! Writes routed while the pool had one copy are waited for first (`UnversionedWrites`): one
//! still in the store when the objects are listed would otherwise stay out of the history, and
//! go with the holder's copy once the PG left it.

use super::{history::Ask, layout};
use crate::reactor::Shard;
use carmine_pg::{Interval, PgLog, Version};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::PgId;
use futures::channel::oneshot;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

/// Objects listed per store call.
const LIST_PAGE: usize = 1024;
/// How often the drain of one-copy writes is looked at.
const DRAIN_POLL: Duration = Duration::from_millis(5);
/// How long a history read may take before it is asked again.
const ANSWER_WAIT: Duration = Duration::from_secs(3);
/// A drain this long is said in the log (a write stuck in a full store holds it).
const DRAIN_WARN: Duration = Duration::from_secs(10);
/// A failed attempt (the map store unreachable, a store error) is retried after this long,
/// doubling up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Writes of pools of one copy in flight on a reactor, by the map epoch they were routed in.
/// A handful of epochs at most: an entry goes when its count does.
#[derive(Default)]
pub(crate) struct UnversionedWrites {
    by_epoch: RefCell<Vec<(u32, u32)>>,
}

impl UnversionedWrites {
    /// Counts a write routed in `epoch` until the guard drops (it is done, or its future was).
    pub fn start(&self, epoch: u32) -> UnversionedWrite<'_> {
        let mut v = self.by_epoch.borrow_mut();
        match v.iter_mut().find(|(e, _)| *e == epoch) {
            Some((_, n)) => *n += 1,
            None => v.push((epoch, 1)),
        }
        UnversionedWrite { of: self, epoch }
    }

    fn any_before(&self, epoch: u32) -> bool {
        self.by_epoch.borrow().iter().any(|(e, _)| *e < epoch)
    }
}

pub(crate) struct UnversionedWrite<'a> {
    of: &'a UnversionedWrites,
    epoch: u32,
}

impl Drop for UnversionedWrite<'_> {
    fn drop(&mut self) {
        let mut v = self.of.by_epoch.borrow_mut();
        if let Some(i) = v.iter().position(|(e, _)| *e == self.epoch) {
            v[i].1 -= 1;
            if v[i].1 == 0 {
                v.swap_remove(i);
            }
        }
    }
}

type HistoryWaiter = oneshot::Sender<Result<Vec<Interval>, String>>;

/// PGs being looked at, each with the asker of its history (and the epoch it asked in).
pub(crate) type Adopting = RefCell<HashMap<PgId, Option<(u32, HistoryWaiter)>>>;

/// Hands the map store's answer for `pg`, asked in `epoch`, to the adoption that asked for
/// it; false if none did.
pub(crate) fn answered<S>(
    shard: &Shard<S>,
    pg: PgId,
    epoch: u32,
    answer: Result<Vec<Interval>, String>,
) -> bool {
    let mut adopting = shard.replication.adopting.borrow_mut();
    let Some(slot) = adopting.get_mut(&pg) else {
        return false;
    };
    match slot.take() {
        Some((asked, tx)) if asked == epoch => {
            let _ = tx.send(answer);
            true
        }
        other => {
            *slot = other;
            false
        }
    }
}

/// True while this reactor may hold objects of `pg` it has not looked at yet: before its
/// collections were listed after a map, or while they are taken in. A peer's query about the
/// PG then goes unanswered (its primary asks again) rather than hear "nothing here".
pub(crate) fn may_hold<S>(shard: &Shard<S>, pg: PgId) -> bool {
    let repl = &shard.replication;
    given_copies_at(shard, pg).is_some()
        && (repl.scans.get() > 0 || repl.adopting.borrow().contains_key(&pg))
}

/// The last epoch of one copy of `pg`'s pool, if the map says it was given copies in place
/// and has them still.
fn given_copies_at<S>(shard: &Shard<S>, pg: PgId) -> Option<u32> {
    let view = shard.view.borrow();
    let map = &view.map;
    let e0 = *map.given_copies.get(&pg.pool)?;
    map.pool(pg.pool)
        .is_ok_and(|p| p.size > 1 && pg.seed < p.pg_num)
        .then_some(e0)
}

/// A look at the store's collections in progress (see [`may_hold`]).
pub(crate) struct Scan<'a>(&'a super::Replication);

impl<'a> Scan<'a> {
    pub fn start(repl: &'a super::Replication) -> Self {
        repl.scans.set(repl.scans.get() + 1);
        Scan(repl)
    }
}

impl Drop for Scan<'_> {
    fn drop(&mut self) {
        self.0.scans.set(self.0.scans.get() - 1);
    }
}

/// Starts looking at `pg`'s copy here, which has no member, once: it is taken in, cleared
/// or left alone, and its member starts if it should.
pub(crate) fn start<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pg: PgId) {
    let repl = &shard.replication;
    if repl.adopting.borrow().contains_key(&pg) {
        return;
    }
    repl.adopting.borrow_mut().insert(pg, None);
    let shard = shard.clone();
    carmine_reactor::spawn(async move {
        let mut wait = RETRY_FIRST;
        loop {
            match adopt(&shard, pg).await {
                Ok(()) => break,
                Err(why) => {
                    tracing::warn!(%pg, "taking in the objects of a pool given copies: {why}; trying again");
                    carmine_reactor::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
        shard.replication.adopting.borrow_mut().remove(&pg);
    })
    .detach();
}

async fn adopt<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pg: PgId) -> Result<(), String> {
    let repl = &shard.replication;
    let epoch = shard.view.borrow().map.epoch;
    let draining = std::time::Instant::now();
    let mut warned = false;
    while repl.unversioned.any_before(epoch) {
        if !warned && draining.elapsed() > DRAIN_WARN {
            warned = true;
            tracing::warn!(%pg, "still waiting for writes of pools of one copy to finish");
        }
        carmine_reactor::sleep(DRAIN_POLL).await;
    }
    // The pool removed (or never given copies): nothing to do here (`removed_pools` deletes
    // what this OSD holds of a removed pool).
    let Some(given_at) = given_copies_at(shard, pg) else {
        return Ok(());
    };
    if repl.pg(pg).is_some() {
        return Ok(());
    }
    if let Some(loaded) = layout::load_pg(&shard.store, pg, repl.log_max).await? {
        // State stored here already (no member started on it yet): the member starts on it.
        let (member, held, stored_log) = loaded.into_member(repl.osd);
        super::start_member(shard, pg, repl.with_lease(member), held, stored_log);
        return Ok(());
    }
    let holds_objects = match shard.store.list_objects(pg, None, 1).await {
        Ok(page) => !page.items.is_empty(),
        // Gone meanwhile (the pool removed, a purge): nothing to take in.
        Err(e) if e.kind == carmine_store::StoreErrorKind::CollectionNotFound => return Ok(()),
        Err(e) => return Err(format!("listing PG {pg}: {e}")),
    };
    if !holds_objects && !placed(shard, pg) {
        repl.looked_at.borrow_mut().insert(pg);
        return Ok(());
    }
    let history = ask_history(shard, pg, epoch).await?;
    match history.as_slice() {
        // Named the holder by the history `pool set` recorded for the epoch the map names.
        [Interval { epoch: e0, acting }] if acting.as_slice() == [repl.osd] && *e0 == given_at => {
            take_in(shard, pg, *e0).await
        }
        _ if !holds_objects => {
            start_empty(shard, pg);
            Ok(())
        }
        // Objects no recorded interval accounts for, and no history to say whose they are:
        // deleting them on a history the map store may have lost could destroy the only copy.
        // Left alone, and said; no member starts on them.
        [] => {
            tracing::error!(%pg,
                "this OSD holds objects of the PG with no state, and the PG has no recorded \
                 history: left alone (no member of the PG starts here)");
            repl.looked_at.borrow_mut().insert(pg);
            Ok(())
        }
        _ => clear(shard, pg, &history).await,
    }
}

/// True if `pg` is served by this reactor in its map.
fn placed<S>(shard: &Shard<S>, pg: PgId) -> bool {
    let view = shard.view.borrow();
    super::placed_here(&view.map, shard.osd, shard.index)
        .iter()
        .any(|(p, _)| *p == pg)
}

async fn ask_history<S>(shard: &Shard<S>, pg: PgId, epoch: u32) -> Result<Vec<Interval>, String> {
    let repl = &shard.replication;
    let Some(h) = &repl.history else {
        return Err("this OSD has no map store for PG histories".into());
    };
    let (tx, rx) = oneshot::channel();
    if let Some(slot) = repl.adopting.borrow_mut().get_mut(&pg) {
        *slot = Some((epoch, tx));
    }
    if !h.ask(Ask::Get { pg, epoch }) {
        return Err("the map store's worker is busy".into());
    }
    // Bounded: an answer that never comes (lost, or the worker stuck on the map store) is
    // asked again rather than waited for with the PG's queries unanswered.
    let waited = std::pin::pin!(carmine_reactor::sleep(ANSWER_WAIT));
    match futures::future::select(rx, waited).await {
        futures::future::Either::Left((answer, _)) => {
            answer.map_err(|_| "the map store's worker went away".to_string())?
        }
        futures::future::Either::Right(_) => {
            if let Some(slot) = repl.adopting.borrow_mut().get_mut(&pg) {
                *slot = None;
            }
            Err(format!(
                "the map store did not answer within {ANSWER_WAIT:?}"
            ))
        }
    }
}

/// Stores every object of `pg` here at the adoption version, then starts its member.
async fn take_in<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pg: PgId,
    e0: u32,
) -> Result<(), String> {
    let repl = &shard.replication;
    let version = adoption_version(e0);
    let mut held = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = shard
            .store
            .list_objects(pg, after.as_deref(), LIST_PAGE)
            .await
            .map_err(|e| format!("listing PG {pg}: {e}"))?;
        held.extend(page.items.into_iter().map(|o| (o, version)));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let log = PgLog::from_parts(repl.log_max, version, version, Vec::new())
        .expect("an empty log at one version");
    let marks = layout::Marks {
        les: e0,
        primary_run: (e0, 0),
    };
    // The pool may have gone while the objects were listed: its sweep would then not see
    // a state stored now.
    if given_copies_at(shard, pg).is_none() {
        return Ok(());
    }
    let mut txn = Transaction::new();
    layout::replace_all(&mut txn, pg, &log, &held, &BTreeMap::new(), marks);
    shard
        .store
        .submit(txn)
        .await
        .map_err(|e| format!("storing PG {pg}'s versions: {e}"))?;
    let loaded = layout::load_pg(&shard.store, pg, repl.log_max)
        .await?
        .ok_or_else(|| format!("PG {pg}'s state is not there after storing it"))?;
    tracing::info!(%pg, objects = held.len(), epoch = e0,
        "objects this OSD held for a pool of one copy taken into the PG's history");
    let (member, held, stored_log) = loaded.into_member(repl.osd);
    // Started even if the map moved the PG away meanwhile: its state is stored, and a copy
    // not placed here is a stray, kept until the PG is clean elsewhere.
    super::start_member(shard, pg, repl.with_lease(member), held, stored_log);
    Ok(())
}

/// Deletes objects this OSD holds without state in `pg`, whose recorded history names other
/// OSDs: leftovers of the PG's one copy from before it moved away, older than any the history
/// accounts for. Then its member starts empty, if the PG is placed here.
async fn clear<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pg: PgId,
    history: &[Interval],
) -> Result<(), String> {
    let removed = super::remove_state_and_objects(&shard.store, pg)
        .await
        .map_err(|e| format!("removing PG {pg}'s leftover objects: {e}"))?;
    tracing::warn!(%pg, removed, ?history,
        "objects held here without versions, which the PG's history does not account for: deleted");
    start_empty(shard, pg);
    Ok(())
}

/// Starts `pg`'s member with nothing stored, if the PG is placed here.
fn start_empty<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pg: PgId) {
    if placed(shard, pg) {
        let repl = &shard.replication;
        super::start_member(shard, pg, repl.new_member(), BTreeMap::new(), Vec::new());
    }
}

/// The version objects taken in from a pool of one copy have: the first of run 0 of its last
/// one-copy epoch (every write of the PG's replicated history is later).
pub(crate) fn adoption_version(e0: u32) -> Version {
    Version::in_run(e0, 0, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_counted_by_epoch_until_their_guards_drop() {
        let w = UnversionedWrites::default();
        let a = w.start(3);
        let b = w.start(3);
        let c = w.start(5);
        assert!(w.any_before(4));
        drop(a);
        assert!(w.any_before(4), "one of epoch 3 still runs");
        drop(b);
        assert!(!w.any_before(4));
        assert!(w.any_before(6));
        drop(c);
        assert!(!w.any_before(u32::MAX));
        assert!(
            w.by_epoch.borrow().is_empty(),
            "entries go with their counts"
        );
    }

    #[test]
    fn the_adoption_version_comes_before_any_write_of_a_later_epoch() {
        let v = adoption_version(7);
        assert!(v > Version::ZERO);
        let next = v.next_in(8, 0).unwrap();
        assert!(next > v && next.follows(v));
        assert!(
            Version::ZERO < v,
            "a new copy's empty log is below it: it is backfilled"
        );
    }
}
