//! Temporary acting sets seen from the primaries (decision 0015): a primary whose acting
//! members lack most of the PG asks for the others to serve it while they fill as backfill
//! targets; it watches the fill, makes writes wait for stragglers, and asks for the set to go
//! once the targets are full. The map changes go through the temporary sets' worker
//! (`history::start`), merged across reactors.

use super::history::TempChange;
use super::PgReplica;
use crate::reactor::Shard;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Asks for a temporary acting set for each PG this reactor is the active primary of whose
/// acting members lack most of it (`Member::wants_temp`: back empty, or gone long), and at
/// least `RecoveryConfig::backfill_min_objects`, once per epoch; the map's answer is a new
/// epoch in which each is served by the others while they fill as backfill targets. All of
/// this reactor's asks of one tick go together.
pub(super) fn ask_temps<S>(shard: &Shard<S>, all: &[Rc<PgReplica>]) {
    let Some(h) = shard
        .replication
        .history
        .as_ref()
        .filter(|h| h.can_change_temps())
    else {
        return;
    };
    let min_lacks = shard.replication.backfill_min_objects;
    let mut asks = Vec::new();
    for pgr in all.iter().filter(|p| p.broken.borrow().is_none()) {
        let m = pgr.member.borrow();
        if pgr.temp_asked.get() >= m.epoch() {
            continue;
        }
        if let Some(set) = m.wants_temp(min_lacks) {
            asks.push((pgr, m.epoch(), m.acting().to_vec(), set));
        }
    }
    if asks.is_empty() {
        return;
    }
    for (pgr, epoch, acting, set) in &asks {
        tracing::info!(pg = %pgr.pg, epoch, ?acting, ?set,
            "acting members lack most of this PG (back empty, or gone long): asking for the \
             others to serve it while they fill as backfill targets");
    }
    let changes = asks
        .iter()
        .map(|(p, _, acting, set)| TempChange::Ask {
            pg: p.pg,
            acting: acting.clone(),
            set: set.clone(),
        })
        .collect();
    if h.change_temps(changes) {
        for (p, epoch, _, _) in &asks {
            p.temp_asked.set(*epoch);
        }
    }
}

/// How a primary's backfill targets fill: since when, how many objects they lacked when
/// last looked at, since when that count stands, and whether it ever went down.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FillWatch {
    since: Instant,
    misplaced: usize,
    unchanged_since: Instant,
    progressed: bool,
}

/// A fill whose targets lack this few objects, and no fewer for `STRAGGLERS_STALL`, has its
/// writes wait for them (`Member::wait_for_targets`): objects written faster than a target
/// copies them, which the background never catches up with. A fill that never progressed
/// (its PG waits its turn for recovery, or its one lacking object is the hot one) is given
/// `STRAGGLERS_DEADLINE` before that.
const STRAGGLERS: usize = 8;
const STRAGGLERS_STALL: Duration = Duration::from_secs(10);
const STRAGGLERS_DEADLINE: Duration = Duration::from_secs(60);

/// Watches the fill of every PG this reactor is the active primary of with backfill targets.
pub(super) fn watch_fills(all: &[Rc<PgReplica>]) {
    let now = Instant::now();
    for pgr in all.iter().filter(|p| p.broken.borrow().is_none()) {
        let (filling, misplaced, waits) = {
            let m = pgr.member.borrow();
            let filling = m.is_active_primary() && !m.targets().is_empty() && !m.targets_filled();
            (filling, m.misplaced(), m.waits_for_targets())
        };
        if !filling {
            pgr.fill.set(None);
            continue;
        }
        let mut w = pgr.fill.get().unwrap_or(FillWatch {
            since: now,
            misplaced,
            unchanged_since: now,
            progressed: false,
        });
        if misplaced != w.misplaced {
            w.progressed |= misplaced < w.misplaced;
            w.misplaced = misplaced;
            w.unchanged_since = now;
        }
        pgr.fill.set(Some(w));
        let stalled = now.duration_since(w.unchanged_since) >= STRAGGLERS_STALL
            && (w.progressed || now.duration_since(w.since) >= STRAGGLERS_DEADLINE);
        if !waits && misplaced <= STRAGGLERS && stalled {
            tracing::info!(pg = %pgr.pg, objects = misplaced,
                "the backfill targets' last lacking objects are not caught up with in the \
                 background (written faster than copied): writes to them now wait for the \
                 targets to recover them");
            pgr.member.borrow_mut().wait_for_targets();
        }
    }
}

/// How long PGs whose backfill targets are full wait for the others of this reactor still
/// filling, so that their temporary acting sets go in one map epoch rather than one each.
const RELEASE_HOLD: Duration = Duration::from_secs(10);

/// Asks for the temporary acting sets of the PGs this reactor is primary of whose backfill
/// targets are full to go (decision 0015, step 4): all at once, when none of its PGs is
/// still filling or the first has waited `RELEASE_HOLD`.
pub(super) fn release_filled<S>(shard: &Shard<S>, all: &[Rc<PgReplica>]) {
    // An OSD that cannot change the map (in-process tests) leaves its sets to the operator.
    let Some(h) = shard
        .replication
        .history
        .as_ref()
        .filter(|h| h.can_change_temps())
    else {
        return;
    };
    let (mut ready, mut filling) = (Vec::new(), false);
    for pgr in all.iter().filter(|p| p.broken.borrow().is_none()) {
        let m = pgr.member.borrow();
        if !m.is_active_primary() || m.targets().is_empty() {
            continue;
        }
        if !m.targets_filled() {
            filling = true;
        } else if pgr.released.get() < m.epoch() {
            ready.push((pgr, m.epoch(), m.acting().to_vec(), m.targets().to_vec()));
        }
    }
    let since = &shard.replication.filled_since;
    if ready.is_empty() {
        since.set(None);
        return;
    }
    let first = *since.get().get_or_insert_with(Instant::now);
    since.set(Some(first));
    if filling && first.elapsed() < RELEASE_HOLD {
        return;
    }
    let changes = ready
        .iter()
        .map(|(p, _, acting, filled)| TempChange::Release {
            pg: p.pg,
            acting: acting.clone(),
            filled: filled.clone(),
        })
        .collect();
    if h.change_temps(changes) {
        for (p, epoch, _, _) in &ready {
            p.released.set(*epoch);
        }
        since.set(None);
    }
}
