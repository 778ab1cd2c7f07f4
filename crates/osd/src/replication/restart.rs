//! A PG copy whose store refused a change restarts from what its store holds, alone, the way
//! the whole OSD would after a crash. The store applies a transaction whole or not at all,
//! so the copy on disk is its last durable state: everything this member acknowledged, and
//! nothing after. The restarted member has a new incarnation; its primary hears "not active"
//! on its next write or ping and activates it again in a new round (or, if the copy was the
//! primary, it peers again), and what the copy lacks is recovered like after any restart.
//!
//! Until then the copy is silent, like a crashed one: its writes in flight are refused (their
//! clients retry, and the request id finds them), and a primary that waits for it may report
//! it to the managers. A copy that keeps failing waits longer each time (doubling from
//! [`FIRST_DELAY`] up to [`DELAY_MAX`]), so a store that fails every write (a dying device)
//! is reported by its peers and its OSD marked down, as a hung one would be.

use super::{feed_map, layout, PgReplica};
use crate::reactor::Shard;
use carmine_store::ObjectStore;
use carmine_types::PgId;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The pause before the first restart: enough for a burst of failing writes to end.
pub(crate) const FIRST_DELAY: Duration = Duration::from_millis(200);
pub(crate) const DELAY_MAX: Duration = Duration::from_secs(60);
/// A copy that served this long since its last failure starts again from `FIRST_DELAY`.
const CALM: Duration = Duration::from_secs(600);
/// How often the restart looks whether the old copy's store work has ended.
const IDLE_POLL: Duration = Duration::from_millis(10);

/// The failures of each PG's copy on this reactor, for the delay before its restart.
#[derive(Default)]
pub(crate) struct Breaks(std::cell::RefCell<std::collections::HashMap<PgId, (u32, Instant)>>);

impl Breaks {
    /// Counts a failure of `pg`'s copy now; the delay before it restarts.
    fn count(&self, pg: PgId) -> Duration {
        let now = Instant::now();
        let mut all = self.0.borrow_mut();
        let (n, last) = all.entry(pg).or_insert((0, now));
        if now.duration_since(*last) > CALM {
            *n = 0;
        }
        *n = n.saturating_add(1);
        *last = now;
        delay_after(*n)
    }
}

/// The delay before the restart that follows the `n`th failure in a row.
fn delay_after(n: u32) -> Duration {
    FIRST_DELAY
        .saturating_mul(1 << n.saturating_sub(1).min(16))
        .min(DELAY_MAX)
}

/// Restarts `old` (a stopped copy) from its store after the delay its failures call for.
pub(super) fn schedule<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, old: &Rc<PgReplica>) {
    let delay = shard.replication.breaks.count(old.pg);
    tracing::warn!(pg = %old.pg, delay_ms = delay.as_millis() as u64,
        "this PG copy restarts from its store after a pause");
    let (shard, old) = (shard.clone(), old.clone());
    carmine_reactor::spawn(async move { restart(&shard, &old, delay).await }).detach();
}

/// Whether a stopped copy still works on the store, or serves a read: its persist task, a
/// scrub and a repair end on their own once they see it stopped.
pub(super) fn busy(old: &PgReplica) -> bool {
    old.persisting.get()
        || old.scrub.is_running()
        || old.rewrites.get() > 0
        || old.access.any_reading()
}

/// Whether `old` is still this reactor's copy of its PG.
fn current<S>(shard: &Shard<S>, old: &Rc<PgReplica>) -> bool {
    shard
        .replication
        .pg(old.pg)
        .is_some_and(|p| Rc::ptr_eq(&p, old))
}

async fn restart<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    old: &Rc<PgReplica>,
    delay: Duration,
) {
    carmine_reactor::sleep(delay).await;
    let repl = &shard.replication;
    let busy = || busy(old);
    // Nothing of the old copy may write to the store once the new one has read it: its
    // persist task, a scrub and a repair end on their own once they see it stopped. (Read
    // again if one was still busy when the reading ended.) Nor may a read of the old copy
    // still run: the new copy would answer a query (a new primary then waits out no lease
    // of this OSD's) while that read could still see a write of the new interval.
    let loaded = loop {
        while busy() {
            carmine_reactor::sleep(IDLE_POLL).await;
        }
        if !current(shard, old) {
            return;
        }
        match layout::load_pg(&shard.store, old.pg, repl.log_max).await {
            Ok(_) if busy() => continue,
            Ok(l) => break l,
            Err(why) => {
                tracing::error!(pg = %old.pg, "restarting this PG copy: {why}");
                if current(shard, old) {
                    schedule(shard, old);
                }
                return;
            }
        }
    };
    if !current(shard, old) {
        return;
    }
    let (member, held, stored_log) = match loaded {
        Some(l) => {
            let (m, held, stored_log) = l.into_member(repl.osd);
            (m, held, stored_log.into())
        }
        // Its first history never reached the store: a copy with nothing.
        None => (
            carmine_pg::Member::new(repl.osd, repl.log_max),
            BTreeMap::new(),
            Default::default(),
        ),
    };
    let member = repl.restarted(member, old.member.borrow().incarnation());
    let new = Rc::new(PgReplica::new(
        old.pg,
        member,
        held,
        stored_log,
        &repl.scrub_schedule,
    ));
    repl.pgs.borrow_mut().insert(old.pg, new.clone());
    let map = shard.view.borrow().map.clone();
    feed_map(shard, &new, &map);
    tracing::info!(pg = %old.pg, "this PG copy restarted from its store");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_wait_longer_after_each_failure_in_a_row_up_to_the_cap() {
        assert_eq!(delay_after(1), FIRST_DELAY);
        assert_eq!(delay_after(2), FIRST_DELAY * 2);
        assert_eq!(delay_after(4), FIRST_DELAY * 8);
        assert_eq!(delay_after(30), DELAY_MAX);
        assert_eq!(delay_after(u32::MAX), DELAY_MAX);
        let b = Breaks::default();
        let pg = PgId { pool: 1, seed: 0 };
        assert_eq!(b.count(pg), FIRST_DELAY);
        assert_eq!(b.count(pg), FIRST_DELAY * 2);
        assert_eq!(
            b.count(PgId { pool: 1, seed: 1 }),
            FIRST_DELAY,
            "counted per PG"
        );
    }
}
