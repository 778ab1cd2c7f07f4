//! Client requests on a replicated PG, at its primary. A write gets its version from the
//! member, is applied here and sent to every other acting member at once, and is answered
//! when every one of them has it durable. A write that may fail in the store (a compare, an
//! exclusive create, a remove…) is first judged against this store alone, once the PG has
//! nothing else in flight: only a write that will succeed gets a version, so every copy
//! applies the same changes. Reads are served only by an active primary, which holds every
//! acknowledged write.

use super::access::{ReadTurn, WriteWait};
use super::{drive, op_kind, Outcome, PgReplica};
use crate::handler::{add_ops, from_store, reject};
use crate::reactor::Shard;
use carmine_pg::{Event, ReqId};
use carmine_proto::{ErrorReply, ObjectRequest, OpOutput, OsdOp, Status};
use carmine_store::{ObjectStore, Transaction};
use carmine_types::limits::{ATTR_NAME_LEN_MAX, IO_LEN_MAX, OBJECT_SIZE_MAX, VALUE_LEN_MAX};
use carmine_types::PgId;
use futures::channel::oneshot;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// How long a conditional write waits for the writes before it to be durable.
const QUIET_WAIT: Duration = Duration::from_secs(10);
const QUIET_POLL: Duration = Duration::from_millis(1);
/// How long a request waits for the members that lack its object to recover it, how often it
/// looks, and how often it asks them again to hurry.
const RECOVERY_WAIT: Duration = Duration::from_secs(30);
const RECOVERY_POLL: Duration = Duration::from_millis(2);
const HASTEN_EVERY: Duration = Duration::from_millis(500);

fn inactive(pg: PgId, why: &str) -> ErrorReply {
    reject(Status::PgInactive, format!("pg {pg}: {why}"))
}

/// This copy stopped and restarts from its store: an outage of the PG, which clients wait out.
fn stopped(pg: PgId, why: &str) -> ErrorReply {
    inactive(
        pg,
        &format!("this copy stopped ({why}) and restarts from its store; retry"),
    )
}

/// How long a read waits for the primary's read lease to be renewed (at least; one and a half
/// leases if longer), and how often it looks (coarse: many reads may wait at once).
const LEASE_WAIT: Duration = Duration::from_secs(3);
const LEASE_POLL: Duration = Duration::from_millis(5);

/// A turn to read `oid` of `pg` here, once it may be read: this is the PG's active primary,
/// it holds a read lease from every other acting member (a newer interval cannot be active
/// elsewhere), its store holds the object, and no write to the object is in flight. A lapsed
/// lease is waited for (renewed by the next pings) up to `LEASE_WAIT`, an object being
/// recovered until it is here, a write until it is acknowledged (its log entry on every acting
/// member, its data on `min_size` of them at least); all of it up to the ack wait and a lease
/// wait in all, after which the read is refused for a retry. The common case is one lookup,
/// one borrow and a clock read (and a look at the PG's writes in flight, if any), and taking
/// the turn (a hash of the name and a push on a short vector).
///
/// A write in flight may be in this store and on no other copy: if this OSD died then, the
/// next interval would not have it, and a reader that saw it would see it vanish (Ceph holds
/// reads behind an object's writes for the same reason). Reads wait side by side, not in a
/// line: one held back never holds the next. The turn holds back writes to the object until
/// it is dropped (see `access`); a read that comes while a write waits for the object's
/// earlier readers waits for that write first.
pub(crate) async fn ready_to_read<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pg: PgId,
    oid: &str,
) -> Result<ReadTurn, ErrorReply> {
    let Some(p) = shard.replication.pg(pg) else {
        return Err(inactive(pg, "not active here yet (peering)"));
    };
    if !p.access.write_waits(oid) && may_read_now(&p, oid) {
        return Ok(ReadTurn::take(&p, oid));
    }
    let start = std::time::Instant::now();
    let limit = shard.replication.ack_wait + LEASE_WAIT;
    let too_long = |what: &str| inactive(pg, &format!("{what}; retry"));
    // Behind a write that waits for the object's earlier readers (it waits for no later
    // one, so reads that keep coming never hold it back for ever).
    while p.access.write_waits(oid) {
        if start.elapsed() > limit {
            return Err(too_long(
                "a write to the object waited too long for earlier reads",
            ));
        }
        check_readable(shard, &p).await?;
        // (That may have waited for the lease: the write may have entered meanwhile.)
        if p.access.write_waits(oid) {
            p.access.wait_change().await;
        }
    }
    let turn = ReadTurn::take(&p, oid);
    let mut counted = false;
    loop {
        if may_read_now(&p, oid) {
            return Ok(turn);
        }
        // Held by a write whenever one to its object is in flight while it waits, even if it
        // also waits for the lease meanwhile (which a stopped replica holds back as well).
        if !counted && p.member.borrow().any_in_flight(|o| o == oid) {
            shard.metrics.read_held_by_write();
            counted = true;
        }
        if start.elapsed() > limit {
            return Err(too_long(
                "a write to the object is still in flight after the acknowledgement wait",
            ));
        }
        check_readable(shard, &p).await?;
        if p.member.borrow().missing.contains_key(oid) {
            await_objects(&shard.rc(), &p, oid, true).await?;
            continue;
        }
        if !p.member.borrow().any_in_flight(|o| o == oid) {
            continue;
        }
        if !counted {
            shard.metrics.read_held_by_write();
            counted = true;
        }
        // Woken when writes in flight in the PG complete.
        p.access.wait_change().await;
    }
}

/// Whether `oid` may be read at once.
fn may_read_now(p: &PgReplica, oid: &str) -> bool {
    let m = p.member.borrow();
    m.readable(super::clock())
        && !m.missing.contains_key(oid)
        && p.broken.borrow().is_none()
        && !m.any_in_flight(|o| o == oid)
}

/// The slow path of [`ready_to_read`]: is this the active primary, with a lease?
async fn check_readable<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    p: &Rc<PgReplica>,
) -> Result<(), ErrorReply> {
    if let Some(why) = p.broken.borrow().as_deref() {
        return Err(stopped(p.pg, why));
    }
    if !p.member.borrow().is_active_primary() {
        return Err(inactive(p.pg, "not active here yet (peering)"));
    }
    if p.member.borrow().readable(super::clock()) {
        return Ok(());
    }
    await_lease(&shard.rc(), p).await
}

/// Waits for `pgr`'s read lease to be renewed, pinging at once if a ping is due.
async fn await_lease<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
) -> Result<(), ErrorReply> {
    shard.metrics.read_lease_waited();
    drive(shard, pgr, Event::Clock, None);
    let start = std::time::Instant::now();
    let limit = LEASE_WAIT.max(shard.replication.read_lease().mul_f64(1.5));
    loop {
        if pgr.broken.borrow().is_some() {
            return Err(inactive(pgr.pg, "this copy stopped while a read waited"));
        }
        {
            let m = pgr.member.borrow();
            if !m.is_active_primary() {
                return Err(inactive(pgr.pg, "its interval ended while a read waited"));
            }
            if m.readable(super::clock()) {
                return Ok(());
            }
        }
        if start.elapsed() >= limit {
            shard.metrics.read_lease_refused();
            return Err(inactive(
                pgr.pg,
                "its read lease lapsed: the other copies did not renew it (this OSD may be \
                 cut off from them, and the PG served elsewhere)",
            ));
        }
        carmine_reactor::sleep(LEASE_POLL).await;
    }
}

/// Waits until no acting member that `reader_only` cares about lacks `oid`: for a write, every
/// acting member (its ops may change part of the object, which must be whole first); for a
/// read, this primary. Asks them to recover it first meanwhile. A PG that is not active here
/// waits for nothing: its request is refused as before.
async fn await_objects<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    oid: &str,
    reader_only: bool,
) -> Result<(), ErrorReply> {
    let start = std::time::Instant::now();
    let mut hastened: Option<std::time::Instant> = None;
    loop {
        let waiting = {
            let m = pgr.member.borrow();
            let lacking = m.lacking(oid);
            if reader_only {
                lacking.contains(&shard.osd)
            } else {
                !lacking.is_empty()
            }
        };
        if !waiting {
            return Ok(());
        }
        if let Some(why) = pgr.broken.borrow().as_deref() {
            return Err(stopped(pgr.pg, why));
        }
        if start.elapsed() > RECOVERY_WAIT {
            return Err(inactive(
                pgr.pg,
                &format!("object {oid:?} is still being recovered; retry"),
            ));
        }
        if hastened.is_none_or(|t| t.elapsed() > HASTEN_EVERY) {
            super::hasten(shard, pgr, oid);
            hastened = Some(std::time::Instant::now());
        }
        carmine_reactor::sleep(RECOVERY_POLL).await;
    }
}

/// Ops whose application may fail in the store, depending on what it holds: such a write is
/// applied at the primary before it is replicated.
fn may_fail(op: &OsdOp) -> bool {
    !matches!(
        op,
        OsdOp::Create { exclusive: false }
            | OsdOp::Write { .. }
            | OsdOp::WriteFull { .. }
            | OsdOp::Zero { .. }
            | OsdOp::Truncate { .. }
            | OsdOp::SetXattr { .. }
            | OsdOp::OmapSet { .. }
            | OsdOp::OmapSetHeader { .. }
    )
}

/// The largest object a replicated PG keeps: recovery copies an object to a member in one
/// message (`pull`), so a larger one could never be copied and its PG would wait for it
/// forever. Volumes' objects are at most this size.
pub(crate) const REPLICATED_OBJECT_SIZE_MAX: u64 = IO_LEN_MAX as u64;

/// The limits the store enforces, checked before a write gets a version: a write every
/// copy would refuse must never enter the log. And objects no larger than recovery carries.
fn check_limits(ops: &[OsdOp]) -> Result<(), ErrorReply> {
    let bad = |m: String| Err(reject(Status::InvalidArgument, m));
    let too_large = || {
        bad(format!(
            "objects of replicated pools are at most {REPLICATED_OBJECT_SIZE_MAX} bytes \
             (recovery copies an object in one message)"
        ))
    };
    for op in ops {
        match op {
            OsdOp::Write { off, data }
                if off.saturating_add(data.len() as u64) > OBJECT_SIZE_MAX =>
            {
                return bad(format!(
                    "write past the largest object size {OBJECT_SIZE_MAX}"
                ))
            }
            OsdOp::Write { off, data }
                if off.saturating_add(data.len() as u64) > REPLICATED_OBJECT_SIZE_MAX =>
            {
                return too_large()
            }
            OsdOp::Zero { off, len }
                if off.saturating_add(*len) > REPLICATED_OBJECT_SIZE_MAX
                    && off.saturating_add(*len) <= OBJECT_SIZE_MAX =>
            {
                return too_large()
            }
            OsdOp::Truncate { size }
                if *size > REPLICATED_OBJECT_SIZE_MAX && *size <= OBJECT_SIZE_MAX =>
            {
                return too_large()
            }
            OsdOp::Write { data, .. } | OsdOp::WriteFull { data }
                if data.len() > IO_LEN_MAX as usize =>
            {
                return bad(format!(
                    "a write of {} bytes, more than {IO_LEN_MAX}",
                    data.len()
                ))
            }
            OsdOp::Zero { off, len } if off.saturating_add(*len) > OBJECT_SIZE_MAX => {
                return bad(format!(
                    "zeroing past the largest object size {OBJECT_SIZE_MAX}"
                ))
            }
            OsdOp::Truncate { size } if *size > OBJECT_SIZE_MAX => {
                return bad(format!(
                    "truncating past the largest object size {OBJECT_SIZE_MAX}"
                ))
            }
            OsdOp::SetXattr { name, value }
                if name.is_empty()
                    || name.len() > ATTR_NAME_LEN_MAX
                    || value.len() > VALUE_LEN_MAX =>
            {
                return bad("an attribute name or value out of bounds".into())
            }
            OsdOp::OmapSet { kvs }
                if kvs
                    .iter()
                    .any(|(k, v)| k.len() > VALUE_LEN_MAX || v.len() > VALUE_LEN_MAX) =>
            {
                return bad("an omap key or value out of bounds".into())
            }
            OsdOp::OmapSetHeader { data } if data.len() > VALUE_LEN_MAX => {
                return bad("an omap header out of bounds".into())
            }
            _ => {}
        }
    }
    Ok(())
}

/// The share of its store at which a primary refuses writes that may grow it (Ceph's
/// `full_ratio`). A write the store refuses for space once it has a version stops the copy,
/// so it must be refused before, with room left for the writes already in flight.
const FULL_RATIO: f64 = 0.95;

/// Refuses with `NoSpace` a write that may need space while this OSD's store is full, or
/// another acting member's said it was in its last answer to a ping (every quarter lease);
/// removals (which free space) still go through.
fn refuse_when_full<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pgr: &PgReplica,
    ops: &[OsdOp],
) -> Result<(), ErrorReply> {
    let mine = store_full(shard);
    let full: Vec<u32> = {
        let m = pgr.member.borrow();
        let others = m.full_members();
        if !mine && others.is_empty() {
            return Ok(());
        }
        mine.then_some(shard.osd)
            .into_iter()
            .chain(others.iter().copied())
            .collect()
    };
    let frees = |op: &OsdOp| {
        matches!(
            op,
            OsdOp::Remove | OsdOp::CmpXattr { .. } | OsdOp::CmpOmap { .. }
        )
    };
    if ops.iter().all(frees) {
        return Ok(());
    }
    let names: Vec<String> = full.iter().map(|o| format!("osd.{o}")).collect();
    Err(reject(
        Status::NoSpace,
        format!(
            "pg {}: the store of {} is {:.0}% full or more: writes are refused until space is \
             freed (removals go through)",
            pgr.pg,
            names.join(", "),
            FULL_RATIO * 100.0
        ),
    ))
}

/// Once the store refused a change for room, it counts as full until this share of it is
/// free again below where it was then (the ratio alone would let the next write in, and fail
/// on another copy of the PG).
const REFUSED_ROOM_MARGIN: f64 = 0.05;
/// ...or until this long has passed (a native store may refuse room while its cleaner is
/// behind, below any ratio; a write that overflows again renews the mark).
const REFUSED_ROOM_HOLD: Duration = Duration::from_secs(60);

/// Whether this reactor's store is full: writes that may grow it are refused. It is, at
/// `FULL_RATIO`, or since it refused a change for room until enough was freed.
pub(crate) fn store_full<S: ObjectStore>(shard: &Shard<S>) -> bool {
    let s = shard.store.statfs();
    if s.bytes_total == 0 {
        return false;
    }
    if s.bytes_used as f64 >= s.bytes_total as f64 * FULL_RATIO {
        return true;
    }
    let refused = &shard.replication.refused_room;
    match refused.get() {
        Some((at, since))
            if s.bytes_used as f64 + s.bytes_total as f64 * REFUSED_ROOM_MARGIN > at as f64
                && since.elapsed() < REFUSED_ROOM_HOLD =>
        {
            true
        }
        Some(_) => {
            refused.set(None);
            shard.metrics.set_store_refused_room(false);
            false
        }
        None => false,
    }
}

/// The longest a write waits for the reads of its object that came before it. No read takes a
/// turn while the write waits, and each one gives up after its own waits (writes in flight,
/// its lease, its object's recovery): this is only a bound should one not.
const READERS_WAIT: Duration = Duration::from_secs(120);

/// Waits until the reads of `mark`'s object that came before the write are done.
async fn await_readers<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pgr: &PgReplica,
    mark: &WriteWait<'_>,
) -> Result<(), ErrorReply> {
    if mark.readers_gone() {
        return Ok(());
    }
    shard.metrics.write_held_by_reads();
    let start = std::time::Instant::now();
    while !mark.readers_gone() {
        if let Some(why) = pgr.broken.borrow().as_deref() {
            return Err(stopped(pgr.pg, why));
        }
        if start.elapsed() > READERS_WAIT {
            return Err(inactive(
                pgr.pg,
                "reads of its object held the write back too long; nothing applied: retry",
            ));
        }
        pgr.access.wait_change().await;
    }
    Ok(())
}

/// The longest a write waits for scrub chunks comparing its object (each lasts milliseconds,
/// or a second for a deep chunk of large objects; a member slow to report may hold one for its
/// reply timeouts).
const FENCE_WAIT: Duration = Duration::from_secs(120);

/// Waits while a scrub chunk compares `oid`.
async fn await_unfenced<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    pgr: &PgReplica,
    oid: &str,
) -> Result<(), ErrorReply> {
    if !pgr.fenced(oid) {
        return Ok(());
    }
    shard.metrics.write_held_by_scrub();
    let start = std::time::Instant::now();
    while pgr.fenced(oid) {
        if let Some(why) = pgr.broken.borrow().as_deref() {
            return Err(stopped(pgr.pg, why));
        }
        if start.elapsed() > FENCE_WAIT {
            return Err(inactive(
                pgr.pg,
                "a scrub of its object held the write back too long; nothing applied: retry",
            ));
        }
        carmine_reactor::sleep(QUIET_POLL).await;
    }
    Ok(())
}

/// What replicas apply of a write that passed its checks here: no compares, and a create
/// that is no longer exclusive (it was, here).
fn replicated_ops(ops: &[OsdOp]) -> Vec<OsdOp> {
    ops.iter()
        .filter(|op| !matches!(op, OsdOp::CmpXattr { .. } | OsdOp::CmpOmap { .. }))
        .map(|op| match op {
            OsdOp::Create { .. } => OsdOp::Create { exclusive: false },
            other => other.clone(),
        })
        .collect()
}

pub(crate) async fn write<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pg: PgId,
    req: ObjectRequest,
) -> Result<Vec<OpOutput>, ErrorReply> {
    let pgr = shard
        .replication
        .pg(pg)
        .ok_or_else(|| inactive(pg, "no copy of it here yet"))?;
    if let Some(why) = pgr.broken.borrow().as_deref() {
        return Err(stopped(pg, why));
    }
    check_limits(&req.ops)?;
    let n = req.ops.len();
    let reqid = match (req.client, req.tid) {
        (0, _) | (_, 0) => ReqId {
            // Anonymous: a request id no other request has, so it is never taken for one.
            client: 0,
            tid: rand::random(),
        },
        (client, tid) => ReqId { client, tid },
    };
    // A retry of a write made (or in flight) is answered from the log whatever the stores'
    // room: a final NoSpace would tell its client it was not applied.
    // (The log is searched only when a store is full: not once per write.)
    if let Err(e) = refuse_when_full(shard, &pgr, &req.ops) {
        if pgr.member.borrow().log.find_request(reqid).is_none() {
            shard.metrics.write_refused_full();
            return Err(e);
        }
    }
    let kind = op_kind(&req.ops);
    let judged = req.ops.iter().any(may_fail);
    let waiter = if !judged && enters_at_once(&pgr, &req.oid) {
        enter(shard, &pgr, reqid, &req.oid, kind, req.ops)
    } else {
        // Behind every earlier write to the object that could not enter at once either: one
        // client's writes to an object apply in the order they came, whatever held the first
        // back and however soon it saw that it may go.
        let line = InLine::join(&pgr, &req.oid);
        let _place = line.line.order.lock().await;
        line.took_place()?;
        // Every acting member holds the object before it is written.
        if pgr.member.borrow().any_lacks(&req.oid) {
            await_objects(shard, &pgr, &req.oid, false).await?;
        }
        // Set once reads of the object that came before it are found: it goes after them,
        // and reads that come from then on wait until it entered (see `access`).
        let mut mark = None;
        let rx = if judged {
            loop {
                // A scrub chunk comparing the object is waited for outside the gate, so the
                // PG's other writes go on meanwhile.
                await_unfenced(shard, &pgr, &req.oid).await?;
                let turn = pgr.gate.lock().await;
                let judged = conditional(shard, &pgr, reqid, &req).await;
                if judged
                    .as_ref()
                    .is_err_and(|e| e.status != Status::PgInactive)
                {
                    // Final (a compare that failed, an object that exists…): its client does
                    // not send it again, and the writes behind it go on.
                    line.done();
                }
                match judged? {
                    Judged::Holds => {
                        line.done();
                        return Ok(vec![OpOutput::None; n]);
                    }
                    Judged::Entered(rx) => break rx,
                    Judged::Fenced => continue,
                    Judged::Read => {
                        drop(turn);
                        let mark =
                            mark.get_or_insert_with(|| WriteWait::mark(&pgr.access, &req.oid));
                        await_readers(shard, &pgr, mark).await?;
                    }
                }
            }
        } else {
            let turn = loop {
                if pgr.fenced(&req.oid) {
                    await_unfenced(shard, &pgr, &req.oid).await?;
                    continue;
                }
                let turn = if pgr.gate.is_idle() {
                    None
                } else {
                    // A conditional write (or a read's repair) holds the gate or waits for
                    // it: this write enters in its turn, holding the gate, never while one is
                    // judged. One turn per try: writes that waited for the gate and went back
                    // to the end of its queue whenever another waited too passed it to each
                    // other for ever.
                    let turn = pgr.gate.lock().await;
                    if pgr.fenced(&req.oid) {
                        continue;
                    }
                    Some(turn)
                };
                if !pgr.access.reading(&req.oid) {
                    break turn;
                }
                // Reads of the object came first: waited for without the gate (the PG's
                // other writes go on), then fence and gate are looked at again. Once marked,
                // no read takes a turn, so this happens once.
                drop(turn);
                let mark = mark.get_or_insert_with(|| WriteWait::mark(&pgr.access, &req.oid));
                await_readers(shard, &pgr, mark).await?;
            };
            let rx = enter(shard, &pgr, reqid, &req.oid, kind, req.ops);
            drop(turn);
            rx
        };
        line.done();
        rx
    };
    let mut waiter = waiter;
    if let Ok(Some(outcome)) = waiter.try_recv() {
        // Answered at once: a retry found in the log, or refused before it entered.
        return match outcome {
            Outcome::Acked(_) => Ok(vec![OpOutput::None; n]),
            Outcome::Refused => Err(inactive(pg, "not active here (peering); nothing applied")),
        };
    }
    let ack_wait = shard.replication.ack_wait;
    match carmine_reactor::timeout(ack_wait, waiter).await {
        Ok(Ok(Outcome::Acked(_))) => Ok(vec![OpOutput::None; n]),
        // It may be on some copies: the PG recognises its retry by the request number and
        // answers it from the log if it survived peering, or applies it if it did not.
        Ok(Ok(Outcome::Refused) | Err(_)) => Err(inactive(
            pg,
            "the PG's interval ended with the write in flight (in doubt): retry it",
        )),
        // Still in flight: a retry waits for the same outcome.
        Err(_) => {
            shard.metrics.write_ack_timed_out();
            Err(inactive(
                pg,
                &format!(
                    "the write waited {ack_wait:?} for its copies and is still in flight (in \
                     doubt): retry it"
                ),
            ))
        }
    }
}

/// Whether a plain write to `oid` may enter now, with no await before: no scrub chunk
/// compares its object, no conditional write is judged, every acting member holds the
/// object, no earlier write to it waits, and no read of it runs or waits. The common case: a
/// borrow or two, no lookup unless some write waits or some read runs in the PG.
fn enters_at_once(pgr: &PgReplica, oid: &str) -> bool {
    pgr.gate.is_idle()
        && !pgr.fenced(oid)
        && !pgr.access.reading(oid)
        && {
            let lines = pgr.lines.borrow();
            lines.is_empty() || !lines.contains_key(oid)
        }
        && !pgr.member.borrow().any_lacks(oid)
}

/// The writes to one object that could not enter at once, in order of arrival.
#[derive(Default)]
pub(crate) struct Line {
    order: carmine_reactor::FifoLock,
    /// How many writes left the head of the line without entering, to be sent again (refused
    /// as inactive, or dropped).
    left: Cell<u64>,
}

/// A write's place in its object's line (`PgReplica::lines`). The line goes when its last
/// write does, whether it entered, failed or its request was dropped.
struct InLine<'a> {
    pgr: &'a PgReplica,
    oid: &'a str,
    line: Rc<Line>,
    /// `line.left` when this write joined.
    left_at_join: u64,
    at_head: Cell<bool>,
    done: Cell<bool>,
}

impl<'a> InLine<'a> {
    fn join(pgr: &'a PgReplica, oid: &'a str) -> Self {
        let line = pgr
            .lines
            .borrow_mut()
            .entry(oid.to_string())
            .or_default()
            .clone();
        InLine {
            pgr,
            oid,
            left_at_join: line.left.get(),
            line,
            at_head: Cell::new(false),
            done: Cell::new(false),
        }
    }

    /// At the head of the line: refused if a write that was ahead of this one left without
    /// entering. Its client retries it, after this one had gone in first; so this one is
    /// refused too and retried behind it, in the order the client sends them again.
    fn took_place(&self) -> Result<(), ErrorReply> {
        self.at_head.set(true);
        if self.line.left.get() != self.left_at_join {
            return Err(inactive(
                self.pgr.pg,
                "a write sent before this one to the same object was refused; nothing \
                 applied: retry (in order)",
            ));
        }
        Ok(())
    }

    /// Entered (or answered without a change): the writes behind it go on.
    fn done(&self) {
        self.done.set(true);
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        if self.at_head.get() && !self.done.get() {
            self.line.left.set(self.line.left.get() + 1);
        }
        // Held by the map and by this write alone: no other write is in the line.
        if Rc::strong_count(&self.line) == 2 {
            self.pgr.lines.borrow_mut().remove(self.oid);
        }
    }
}

/// Hands a write to the member; the receiver gets its outcome.
fn enter<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    req: ReqId,
    oid: &str,
    kind: carmine_pg::OpKind,
    ops: Vec<OsdOp>,
) -> oneshot::Receiver<Outcome> {
    let (tx, rx) = oneshot::channel();
    if pgr.broken.borrow().is_some() {
        // A stopped copy takes nothing (it refused its writes in flight as it stopped); a
        // retry of this request may wait on its successor, and is left alone.
        let _ = tx.send(Outcome::Refused);
        return rx;
    }
    shard
        .replication
        .waiters
        .borrow_mut()
        .entry(req)
        .or_default()
        .push(tx);
    let next = pgr.member.borrow().next_version();
    if let Some(v) = next {
        pgr.inflight_ops.borrow_mut().insert(v, ops.clone());
    }
    drive(
        shard,
        pgr,
        Event::Write {
            req,
            oid: oid.to_string(),
            kind,
        },
        Some(&ops),
    );
    if let Some(v) = next {
        // Not a new entry (refused, or a retry answered from the log): nothing to resend.
        let entered = pgr
            .member
            .borrow()
            .log
            .entries()
            .next_back()
            .is_some_and(|e| e.version == v && e.reqid == Some(req));
        if !entered {
            pgr.inflight_ops.borrow_mut().remove(&v);
        }
    }
    rx
}

/// A write that may fail: judged here against the store, alone, once every write before it
/// is durable and every acting member holds the object; it gets a version, and every copy
/// applies it without its compares, only if it will succeed. Nothing is applied anywhere
/// before the member takes it, so an interval that ends meanwhile leaves no trace of it. A
/// request of compares alone changes nothing: it is answered without entering the log.
async fn conditional<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    reqid: ReqId,
    req: &ObjectRequest,
) -> Result<Judged, ErrorReply> {
    let pg = pgr.pg;
    let kind = op_kind(&req.ops);
    let replicated = replicated_ops(&req.ops);
    if pgr.fenced(&req.oid) {
        // Fenced while this write waited for the gate.
        return Ok(Judged::Fenced);
    }
    if pgr.access.reading(&req.oid) && !replicated.is_empty() {
        return Ok(Judged::Read);
    }
    // A retry of a write already made is answered from the log, not applied again.
    if pgr.member.borrow().log.find_request(reqid).is_some() {
        let rx = enter(shard, pgr, reqid, &req.oid, kind, replicated);
        return Ok(Judged::Entered(rx));
    }
    let mut txn = Transaction::new();
    add_ops(&mut txn, pg, &req.oid, req.ops.clone())?;
    // Everything before it durable here, so the store shows every earlier write, and the
    // object here (it may have been recovered while this request waited for the gate).
    let start = std::time::Instant::now();
    let state = loop {
        if start.elapsed() > QUIET_WAIT {
            return Err(inactive(pg, "writes before this one are not durable yet"));
        }
        if pgr.member.borrow().any_lacks(&req.oid) {
            await_objects(shard, pgr, &req.oid, false).await?;
            continue;
        }
        if pgr.fenced(&req.oid) {
            return Ok(Judged::Fenced);
        }
        if pgr.is_quiet() {
            let m = pgr.member.borrow();
            if m.next_version().is_none() {
                return Err(inactive(pg, "not active here (peering)"));
            }
            break (m.interval_start(), m.log.head());
        }
        carmine_reactor::sleep(QUIET_POLL).await;
    };
    carmine_store::check_applies(&shard.store, &txn)
        .await
        .map_err(|e| from_store(e, None))?;
    // The gate kept other writes out, and only a new interval changes what the store holds
    // of an object every member has (recovery fetches only what a member lacks): the
    // judgement stands if the interval and the log are as they were. Else nothing was
    // applied, and the client may simply retry.
    let unchanged = {
        let m = pgr.member.borrow();
        m.next_version().is_some()
            && (m.interval_start(), m.log.head()) == state
            && !m.any_lacks(&req.oid)
            // Compares alone are answered like a read: only while no newer interval can be
            // active elsewhere (the read lease).
            && (!replicated.is_empty() || m.readable(super::clock()))
    };
    if pgr.fenced(&req.oid) {
        // A scrub chunk began comparing the object meanwhile: judged again after it.
        return Ok(Judged::Fenced);
    }
    if !unchanged {
        return Err(inactive(
            pg,
            "the PG changed while the write's conditions were checked; nothing applied: retry",
        ));
    }
    if replicated.is_empty() {
        return Ok(Judged::Holds);
    }
    if pgr.access.reading(&req.oid) {
        // A read of the object took its turn while this write waited to be judged.
        return Ok(Judged::Read);
    }
    Ok(Judged::Entered(enter(
        shard, pgr, reqid, &req.oid, kind, replicated,
    )))
}

/// What became of a conditional write once judged.
enum Judged {
    /// Compares only, and they hold: nothing to write.
    Holds,
    /// Handed to the member; the receiver gets its outcome.
    Entered(oneshot::Receiver<Outcome>),
    /// Not handed over: a scrub chunk compares the object; judge it again once it is done.
    Fenced,
    /// Not handed over: reads of the object that came first run or wait; judge it again
    /// once they are done (reads that come meanwhile wait for it).
    Read,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn a_replicated_object_never_grows_past_what_recovery_carries() {
        let at = |off: u64, len: usize| OsdOp::Write {
            off,
            data: Bytes::from(vec![0u8; len]),
        };
        let max = REPLICATED_OBJECT_SIZE_MAX;
        assert!(check_limits(&[at(max - 4096, 4096)]).is_ok());
        let err = check_limits(&[at(max - 4096, 4097)]).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument);
        assert!(err.message.contains("recovery"), "{}", err.message);
        assert!(check_limits(&[at(max, 1)]).is_err());
        assert!(check_limits(&[OsdOp::Truncate { size: max }]).is_ok());
        assert!(check_limits(&[OsdOp::Truncate { size: max + 1 }]).is_err());
        assert!(check_limits(&[OsdOp::Zero { off: max, len: 1 }]).is_err());
        // Past the store's own limit, the store's reason.
        let err = check_limits(&[OsdOp::Truncate { size: u64::MAX }]).unwrap_err();
        assert!(
            err.message.contains("largest object size"),
            "{}",
            err.message
        );
    }
}
