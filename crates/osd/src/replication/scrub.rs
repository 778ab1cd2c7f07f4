//! Scrub and repair of a replicated PG. The primary walks the PG in chunks of objects in name
//! order; for each chunk it holds back the writes to the chunk's objects (the others go on)
//! until every write in flight to them is durable everywhere, asks each member for its report of the chunk
//! (`ScrubAsk` → `ScrubMap`: versions and sizes, and with `deep` checksums of data, attributes
//! and omap), and lets `carmine_pg::scrub::compare` judge. A repair rewrites each bad copy from
//! the good one (`Push` → `Pushed`, or in place at the primary) and looks at the chunk again.
//!
//! A read at the primary that meets a bad local copy (a checksum error) rewrites it from a
//! member that holds the object at its version, then reads again: no read returns bad bytes,
//! and the copy is healed on the way.
//!
//! Scrubs also run on their own, per the OSD's schedule: each PG light-scrubbed every
//! `light` and deep-scrubbed every `deep`, spread at random over the first period.

use super::{fail, layout, pull, send, Body, ObjectCopy, PgReplica, Replication};
use crate::handler::reject;
use crate::reactor::Shard;
use carmine_pg::scrub::{compare, Digest, ScrubMap, ScrubObject, Verdict, SCRUB_LIST_MAX};
use carmine_pg::Version;
use carmine_proto::SCRUB_FINDINGS_MAX;
use carmine_proto::{ErrorReply, ScrubFinding, ScrubMode, ScrubReport, Status};
use carmine_store::{ObjectStore, StoreError, Transaction};
use carmine_types::{crc32c_append, OsdId, PgId};
use futures::channel::oneshot;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Objects per chunk: writes to the chunk's objects wait while it is compared, so a deep chunk
/// (which reads every byte on every member) is small.
const CHUNK_LIGHT: usize = 128;
const CHUNK_DEEP: usize = 8;
/// How long the primary waits for a member's report or a push's answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a chunk waits for the writes in flight to its objects to become durable everywhere.
const QUIET_WAIT: Duration = Duration::from_secs(10);
const QUIET_POLL: Duration = Duration::from_millis(1);
/// Bytes read per call when checksumming an object.
const READ_PIECE: u64 = 4 << 20;
/// Store listing page size.
const LIST_PAGE: usize = 1024;
/// How often the schedule looks for PGs due (more often only for shorter intervals).
const SCHEDULE_CHECK: Duration = Duration::from_secs(5);
const SCHEDULE_CHECK_MIN: Duration = Duration::from_millis(100);
/// When a scheduled scrub that could not complete is tried again.
const RETRY_LATER: Duration = Duration::from_secs(60);

/// When PGs are scrubbed on their own (`None`: never).
#[derive(Clone, Copy, Debug)]
pub struct ScrubSchedule {
    pub light: Option<Duration>,
    pub deep: Option<Duration>,
}

impl Default for ScrubSchedule {
    /// Ceph's defaults: a light scrub a day, a deep one a week.
    fn default() -> Self {
        ScrubSchedule {
            light: Some(Duration::from_secs(24 * 3600)),
            deep: Some(Duration::from_secs(7 * 24 * 3600)),
        }
    }
}

/// What a PG's host keeps about its scrubs.
pub(crate) struct ScrubState {
    running: Cell<bool>,
    next_light: Cell<Option<Instant>>,
    next_deep: Cell<Option<Instant>>,
    /// Bad copies the last scrub left (it ran without repair, or a repair failed).
    pub unrepaired: Cell<u64>,
}

impl ScrubState {
    pub(crate) fn new(schedule: &ScrubSchedule) -> Self {
        // Spread at random over the first period, so PGs do not all scrub at once.
        let first = |every: Option<Duration>| {
            every.map(|d| Instant::now() + d.mul_f64(rand::random::<f64>()))
        };
        ScrubState {
            running: Cell::new(false),
            next_light: Cell::new(first(schedule.light)),
            next_deep: Cell::new(first(schedule.deep)),
            unrepaired: Cell::new(0),
        }
    }

    /// A scrub of the PG runs here (as its primary), and may rewrite copies.
    pub(crate) fn is_running(&self) -> bool {
        self.running.get()
    }
}

/// Counts a rewrite of `pgr`'s store outside its persist queue while it runs (however it ends).
struct Rewriting<'a>(&'a PgReplica);

impl<'a> Rewriting<'a> {
    fn new(pgr: &'a PgReplica) -> Self {
        pgr.rewrites.set(pgr.rewrites.get() + 1);
        Rewriting(pgr)
    }
}

impl Drop for Rewriting<'_> {
    fn drop(&mut self) {
        self.0.rewrites.set(self.0.rewrites.get() - 1);
    }
}

/// Clears the running flag however the scrub ends (a dropped request too).
struct Running<'a>(&'a ScrubState);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.set(false);
    }
}

/// This reactor's copy of `pg`, for an operator's request.
fn copy_here<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pg: PgId,
) -> Result<Rc<PgReplica>, ErrorReply> {
    let pgr = shard
        .replication
        .pg(pg)
        .ok_or_else(|| inactive(pg, "no copy of it here"))?;
    if pgr.broken.borrow().is_some() {
        return Err(inactive(
            pg,
            "this copy stopped and restarts from its store",
        ));
    }
    Ok(pgr)
}

fn inactive(pg: PgId, why: &str) -> ErrorReply {
    reject(Status::PgInactive, format!("pg {pg}: {why}"))
}

/// Scrubs the whole of `pg`, of which this reactor must be the active primary.
/// Gives up the objects of `pg` that no reachable copy holds, at its primary: returns how
/// many (the PG then goes active without them), or why not.
pub(crate) fn give_up_unfound<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pg: PgId,
) -> Result<u64, ErrorReply> {
    let pgr = copy_here(shard, pg)?;
    let (unfound, incomplete) = {
        let m = pgr.member.borrow();
        (m.unfound() as u64, m.lost_intervals())
    };
    if unfound == 0 && incomplete == 0 {
        return Err(reject(
            Status::InvalidArgument,
            format!(
                "pg {pg} waits for no unfound object and no lost interval here (is this its \
                 primary, peering?)"
            ),
        ));
    }
    tracing::warn!(%pg, unfound, incomplete,
        "the operator gives up the PG's unfound objects and the writes of intervals no copy \
         vouches for");
    super::drive(shard, &pgr, carmine_pg::Event::GiveUpUnfound, None);
    Ok(unfound)
}

pub(crate) async fn scrub<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pg: PgId,
    mode: ScrubMode,
) -> Result<ScrubReport, ErrorReply> {
    let pgr = copy_here(shard, pg)?;
    let (epoch, acting) = {
        let m = pgr.member.borrow();
        if !m.is_active_primary() {
            return Err(inactive(pg, "a scrub runs at the PG's active primary"));
        }
        if !m.is_clean() {
            // Copies still being recovered differ by design; a scrub compares settled ones.
            return Err(inactive(
                pg,
                &format!("{} objects are still being recovered", m.degraded()),
            ));
        }
        (m.epoch(), m.acting().to_vec())
    };
    if pgr.scrub.running.replace(true) {
        return Err(reject(
            Status::Busy,
            format!("pg {pg}: a scrub of it is already running"),
        ));
    }
    let _running = Running(&pgr.scrub);
    let deep = mode.is_deep();
    let mut report = ScrubReport {
        epoch,
        acting: acting.clone(),
        mode,
        objects: 0,
        bytes: 0,
        findings_total: 0,
        findings: Vec::new(),
    };
    let mut after: Option<String> = None;
    loop {
        let upto = chunk_end(shard, &pgr, after.as_deref(), deep).await?;
        let range = (after.clone(), upto);
        // Writes to the chunk's objects wait while it is compared; the PG's others go on.
        let fence = Fence::hold(&pgr, range.clone());
        quiesce(&pgr, epoch, Some(&range)).await?;
        let (maps, upto) = gather(shard, &pgr, epoch, &acting, range.clone(), deep).await?;
        let range = (range.0, upto.clone());
        let expected = expected_in(&pgr, &range);
        let verdicts = judge(shard.osd, &expected, &maps);
        report.objects += expected.len() as u64;
        report.bytes += maps
            .iter()
            .find(|(o, _)| *o == shard.osd)
            .map_or(0, |(_, m)| m.objects.iter().map(|o| o.size).sum());
        let mut left: BTreeSet<(String, OsdId)> = BTreeSet::new();
        if mode == ScrubMode::Repair && !verdicts.is_empty() {
            for v in &verdicts {
                if let Err(why) = repair(shard, &pgr, epoch, v).await {
                    tracing::error!(%pg, oid = v.oid, "repair failed: {why}");
                }
            }
            let (again, _) = gather(shard, &pgr, epoch, &acting, range.clone(), deep).await?;
            let expected = expected_in(&pgr, &range);
            for v in judge(shard.osd, &expected, &again) {
                left.extend(v.bad.iter().map(|(osd, _)| (v.oid.clone(), *osd)));
            }
        } else {
            for v in &verdicts {
                left.extend(v.bad.iter().map(|(osd, _)| (v.oid.clone(), *osd)));
            }
        }
        drop(fence);
        for v in verdicts {
            for (osd, problem) in v.bad {
                report.findings_total += 1;
                let repaired = !left.contains(&(v.oid.clone(), osd));
                if !repaired {
                    tracing::error!(%pg, oid = v.oid, osd, "inconsistent copy: {problem}");
                }
                if report.findings.len() < SCRUB_FINDINGS_MAX {
                    report.findings.push(ScrubFinding {
                        oid: v.oid.clone(),
                        osd,
                        what: problem.to_string(),
                        repaired,
                    });
                }
            }
        }
        match upto {
            Some(u) => after = Some(u),
            None => break,
        }
    }
    let now = Instant::now();
    let sched = &shard.replication.scrub_schedule;
    if let Some(d) = sched.light {
        pgr.scrub.next_light.set(Some(now + d));
    }
    if let (true, Some(d)) = (deep, sched.deep) {
        pgr.scrub.next_deep.set(Some(now + d));
    }
    let unrepaired = report.unrepaired();
    pgr.scrub.unrepaired.set(unrepaired);
    shard.metrics.scrubbed(deep, report.findings_total);
    count_inconsistent(shard);
    tracing::info!(%pg, ?mode, objects = report.objects, findings = report.findings_total,
        unrepaired, "scrub done");
    Ok(report)
}

fn count_inconsistent<S>(shard: &Shard<S>) {
    let n = shard
        .replication
        .pgs
        .borrow()
        .values()
        .filter(|p| p.scrub.unrepaired.get() > 0)
        .count();
    shard.metrics.set_pgs_inconsistent(n as u64);
}

fn judge(
    primary: OsdId,
    expected: &BTreeMap<String, Version>,
    maps: &[(OsdId, ScrubMap)],
) -> Vec<Verdict> {
    let refs: Vec<(OsdId, &ScrubMap)> = maps.iter().map(|(o, m)| (*o, m)).collect();
    compare(expected, &refs, primary)
}

/// Objects after the first name, up to and with the second (`None`: from the start, to the end).
pub(crate) type Range = (Option<String>, Option<String>);

pub(crate) fn in_range(oid: &str, (after, upto): &Range) -> bool {
    after.as_deref().is_none_or(|a| oid > a) && upto.as_deref().is_none_or(|u| oid <= u)
}

/// The PG's objects in `range`, as the primary's member holds them.
fn expected_in(pgr: &PgReplica, range: &Range) -> BTreeMap<String, Version> {
    let m = pgr.member.borrow();
    let start = match &range.0 {
        Some(a) => std::ops::Bound::Excluded(a.clone()),
        None => std::ops::Bound::Unbounded,
    };
    m.objects
        .range((start, std::ops::Bound::Unbounded))
        .take_while(|(o, _)| range.1.as_deref().is_none_or(|u| o.as_str() <= u))
        .map(|(o, v)| (o.clone(), *v))
        .collect()
}

/// Holds back writes to the objects of a scrub chunk while it lives (however the scrub ends).
struct Fence<'a>(&'a PgReplica);

impl<'a> Fence<'a> {
    fn hold(pgr: &'a PgReplica, range: Range) -> Self {
        *pgr.scrub_fence.borrow_mut() = Some(range);
        Fence(pgr)
    }
}

impl Drop for Fence<'_> {
    fn drop(&mut self) {
        self.0.scrub_fence.borrow_mut().take();
    }
}

/// Waits until what a chunk (`range`) or a read's repair (`None`: the whole PG) compares is
/// settled on every member: no write to it in flight or queued for this store. The caller
/// holds new client writes back (a chunk's fence, or the PG's gate; the two do not exclude
/// each other: a read's repair may rewrite the primary's bad copy while a chunk compares it,
/// which at worst reports it as unrepaired). A chunk also needs the PG still clean: a member
/// restarted since the scrub began lacks objects by design.
async fn quiesce(pgr: &PgReplica, epoch: u32, range: Option<&Range>) -> Result<(), ErrorReply> {
    let start = Instant::now();
    loop {
        {
            let m = pgr.member.borrow();
            if !m.is_active_primary() || m.epoch() != epoch || pgr.broken.borrow().is_some() {
                return Err(inactive(
                    pgr.pg,
                    "its interval ended during the scrub, or its copy stopped: run it again",
                ));
            }
            let settled = match range {
                None => pgr.is_quiet(),
                Some(_) if !m.is_clean() => {
                    return Err(inactive(
                        pgr.pg,
                        "objects are being recovered again: run the scrub again",
                    ))
                }
                Some(range) => {
                    let touches = |j: &super::Job| match j {
                        super::Job::Entry { entry, .. } => in_range(&entry.oid, range),
                        super::Job::Recovered { oid, .. } => in_range(oid, range),
                        super::Job::History { .. } | super::Job::Purge => true,
                    };
                    !m.any_in_flight(|o| in_range(o, range))
                        && !pgr.jobs.borrow().iter().any(touches)
                }
            };
            if settled {
                return Ok(());
            }
        }
        if start.elapsed() > QUIET_WAIT {
            return Err(inactive(pgr.pg, "its writes did not settle for the scrub"));
        }
        carmine_reactor::sleep(QUIET_POLL).await;
    }
}

/// Where the chunk starting after `after` ends: its last object, or `None` for the PG's end.
async fn chunk_end<S: ObjectStore>(
    shard: &Shard<S>,
    pgr: &PgReplica,
    after: Option<&str>,
    deep: bool,
) -> Result<Option<String>, ErrorReply> {
    let n = if deep { CHUNK_DEEP } else { CHUNK_LIGHT };
    let listed = shard
        .store
        .list_objects(pgr.pg, after, n)
        .await
        .map_err(|e| crate::handler::from_store(e, None))?;
    let mut names: BTreeSet<String> = listed.items.into_iter().collect();
    names.extend(
        expected_in(pgr, &(after.map(str::to_owned), None))
            .into_keys()
            .take(n),
    );
    Ok(names.into_iter().nth(n - 1))
}

/// Every acting member's report of `range` (this one's too). A member whose list was cut
/// moves the range's end back to its last object; the range's end is returned.
async fn gather<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    epoch: u32,
    acting: &[OsdId],
    range: Range,
    deep: bool,
) -> Result<(Vec<(OsdId, ScrubMap)>, Option<String>), ErrorReply> {
    let pg = pgr.pg;
    let mut replies = Replies::new(&shard.replication);
    for &osd in acting.iter().filter(|o| **o != shard.osd) {
        let token = replies.expect(osd);
        send(
            shard,
            osd,
            pg,
            Body::ScrubAsk {
                epoch,
                token,
                after: range.0.clone(),
                upto: range.1.clone(),
                deep,
            },
        );
    }
    let mine = report(shard, pgr, &range, deep).await;
    let mut maps = vec![(shard.osd, mine)];
    for (osd, body) in replies.wait().await {
        match body {
            Some(Body::ScrubMap { map: Ok(m), .. }) => maps.push((osd, m)),
            Some(Body::ScrubMap { map: Err(why), .. }) => {
                return Err(inactive(pg, &format!("osd.{osd} cannot scrub: {why}")))
            }
            _ => {
                return Err(inactive(
                    pg,
                    &format!("osd.{osd} did not answer the scrub in {REPLY_TIMEOUT:?}"),
                ))
            }
        }
    }
    let mut upto = range.1;
    for (_, m) in &maps {
        if m.truncated {
            if let Some(last) = m.objects.last() {
                if upto.as_ref().is_none_or(|u| last.oid < *u) {
                    upto = Some(last.oid.clone());
                }
            }
        }
    }
    for (_, m) in &mut maps {
        m.objects
            .retain(|o| upto.as_ref().is_none_or(|u| o.oid <= *u));
        m.truncated = false;
    }
    Ok((maps, upto))
}

/// Tokens of replies this primary waits for; forgotten however the wait ends.
struct Replies<'a> {
    repl: &'a Replication,
    waiting: Vec<(OsdId, u64, oneshot::Receiver<Body>)>,
}

impl<'a> Replies<'a> {
    fn new(repl: &'a Replication) -> Self {
        Replies {
            repl,
            waiting: Vec::new(),
        }
    }

    fn expect(&mut self, osd: OsdId) -> u64 {
        let token = self.repl.next_token.get() + 1;
        self.repl.next_token.set(token);
        let (tx, rx) = oneshot::channel();
        self.repl.replies.borrow_mut().insert(token, (osd, tx));
        self.waiting.push((osd, token, rx));
        token
    }

    /// Each member's reply, or `None` if it did not come in time.
    async fn wait(&mut self) -> Vec<(OsdId, Option<Body>)> {
        let waiting = std::mem::take(&mut self.waiting);
        let mut tokens = Vec::new();
        let futs = waiting.into_iter().map(|(osd, token, rx)| {
            tokens.push(token);
            async move {
                (
                    osd,
                    carmine_reactor::timeout(REPLY_TIMEOUT, rx)
                        .await
                        .ok()
                        .and_then(Result::ok),
                )
            }
        });
        let out = futures::future::join_all(futs).await;
        let mut replies = self.repl.replies.borrow_mut();
        for t in tokens {
            replies.remove(&t);
        }
        out
    }
}

impl Drop for Replies<'_> {
    fn drop(&mut self) {
        let mut replies = self.repl.replies.borrow_mut();
        for (_, t, _) in &self.waiting {
            replies.remove(t);
        }
    }
}

/// A member's reply to a scrub ask or a push.
pub(crate) fn reply_arrived<S>(shard: &Shard<S>, from: OsdId, token: u64, body: Body) {
    let mut replies = shard.replication.replies.borrow_mut();
    // Only from the member it was asked of.
    if replies.get(&token).is_some_and(|(osd, _)| *osd == from) {
        let (_, tx) = replies.remove(&token).expect("present");
        let _ = tx.send(body);
    }
}

/// This copy's report of `range`: the objects its store holds there, with the versions its
/// PG state gives them.
async fn report<S: ObjectStore>(
    shard: &Shard<S>,
    pgr: &PgReplica,
    range: &Range,
    deep: bool,
) -> ScrubMap {
    let pg = pgr.pg;
    let mut names = Vec::new();
    let mut truncated = false;
    let mut cursor = range.0.clone();
    'list: loop {
        let page = match shard
            .store
            .list_objects(pg, cursor.as_deref(), LIST_PAGE)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(%pg, "listing the PG for a scrub: {e}");
                break;
            }
        };
        for oid in page.items {
            if !in_range(&oid, range) {
                break 'list;
            }
            if names.len() == SCRUB_LIST_MAX {
                truncated = true;
                break 'list;
            }
            cursor = Some(oid.clone());
            names.push(oid);
        }
        if page.next.is_none() {
            break;
        }
    }
    let mut objects = Vec::with_capacity(names.len());
    for oid in names {
        let version = pgr
            .held
            .borrow()
            .get(&oid)
            .copied()
            .unwrap_or(Version::ZERO);
        let (size, digest, error) = match shard.store.stat(pg, &oid).await {
            Err(e) => (0, None, Some(describe(&e))),
            Ok(st) if !deep => (st.size, None, None),
            Ok(st) => match digest(&shard.store, pg, &oid, st.size).await {
                Ok(d) => (st.size, Some(d), None),
                Err(e) => (st.size, None, Some(describe(&e))),
            },
        };
        objects.push(ScrubObject {
            oid,
            version,
            size,
            digest,
            error,
        });
    }
    ScrubMap { objects, truncated }
}

fn describe(e: &StoreError) -> String {
    format!("{:?}: {}", e.kind, e.detail)
}

/// Checksums of the whole object as this store holds it: every byte is read, so a block
/// that fails the store's own checksum surfaces here as an error.
async fn digest<S: ObjectStore>(
    store: &S,
    pg: PgId,
    oid: &str,
    size: u64,
) -> Result<Digest, StoreError> {
    let mut data = 0u32;
    let mut off = 0;
    while off < size {
        let len = READ_PIECE.min(size - off);
        let piece = store.read(pg, oid, off, len).await?;
        data = crc32c_append(data, &piece);
        off += len;
    }
    let mut attrs = 0u32;
    for (name, value) in store.getattrs(pg, oid).await? {
        attrs = crc32c_append(attrs, &(name.len() as u32).to_le_bytes());
        attrs = crc32c_append(attrs, name.as_bytes());
        attrs = crc32c_append(attrs, &(value.len() as u32).to_le_bytes());
        attrs = crc32c_append(attrs, &value);
    }
    let header = store.omap_get_header(pg, oid).await?;
    let mut omap = crc32c_append(0, &(header.len() as u32).to_le_bytes());
    omap = crc32c_append(omap, &header);
    let mut after: Option<bytes::Bytes> = None;
    loop {
        let page = store
            .omap_iterate(pg, oid, after.as_deref(), LIST_PAGE)
            .await?;
        for (k, v) in &page.items {
            omap = crc32c_append(omap, &(k.len() as u32).to_le_bytes());
            omap = crc32c_append(omap, k);
            omap = crc32c_append(omap, &(v.len() as u32).to_le_bytes());
            omap = crc32c_append(omap, v);
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    Ok(Digest { data, attrs, omap })
}

/// Why this reactor will not scrub or take a push for `pg` from `from` in `epoch`.
fn not_member(
    shard: &Shard<impl ObjectStore>,
    pg: PgId,
    from: OsdId,
    epoch: u32,
) -> Option<String> {
    let Some(pgr) = shard.replication.pg(pg) else {
        return Some(format!("osd.{} holds no copy of pg {pg}", shard.osd));
    };
    if pgr.broken.borrow().is_some() {
        return Some(format!("osd.{}'s copy of pg {pg} stopped", shard.osd));
    }
    let m = pgr.member.borrow();
    (!(m.epoch() == epoch && m.is_activated_replica() && m.acting().first() == Some(&from))).then(
        || {
            format!(
                "osd.{} is not an active replica of pg {pg} under osd.{from} in epoch {epoch}",
                shard.osd
            )
        },
    )
}

/// A member answers its primary's scrub ask.
pub(crate) fn answer<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    from: OsdId,
    pg: PgId,
    epoch: u32,
    token: u64,
    range: Range,
    deep: bool,
) {
    let shard = shard.clone();
    carmine_reactor::spawn(async move {
        let map = match not_member(&shard, pg, from, epoch) {
            Some(why) => Err(why),
            None => {
                let pgr = shard.replication.pg(pg).expect("checked");
                Ok(report(&shard, &pgr, &range, deep).await)
            }
        };
        send(&shard, from, pg, Body::ScrubMap { token, map });
    })
    .detach();
}

/// A member takes a repaired copy from its primary.
#[allow(clippy::too_many_arguments)]
pub(crate) fn take_push<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    from: OsdId,
    pg: PgId,
    epoch: u32,
    token: u64,
    oid: String,
    version: Version,
    copy: Option<ObjectCopy>,
) {
    let shard = shard.clone();
    carmine_reactor::spawn(async move {
        let result = match not_member(&shard, pg, from, epoch) {
            Some(why) => Err(why),
            None => {
                let pgr = shard.replication.pg(pg).expect("checked");
                let v = copy.is_some().then_some(version);
                install(&shard, &pgr, &oid, v, copy, epoch).await
            }
        };
        send(&shard, from, pg, Body::Pushed { token, result });
    })
    .detach();
}

/// Replaces this copy of `oid` with `copy` at `version` (`None`: removes it), with the
/// version the PG's state records for it, in one transaction: a repair decided in `epoch`.
async fn install<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    oid: &str,
    version: Option<Version>,
    copy: Option<ObjectCopy>,
    epoch: u32,
) -> Result<(), String> {
    let pg = pgr.pg;
    // A repair's fetches take a while: if this copy took a newer history meanwhile (the
    // object deleted there, or written again), what was decided before must not land.
    let les = pgr.member.borrow().les;
    if les > epoch {
        return Err(format!(
            "{oid:?} not rewritten: this copy took the history of epoch {les} since the repair \
             was decided in {epoch}"
        ));
    }
    let mut txn = Transaction::new();
    txn.touch(pg, oid).remove(pg, oid);
    if let Some(c) = copy {
        super::persist::install(&mut txn, pg, oid, c);
    }
    layout::set_object_version(&mut txn, pg, oid, version);
    if pgr.broken.borrow().is_some() {
        return Err(format!("{oid:?} not rewritten: this copy stopped"));
    }
    let _rewriting = Rewriting::new(pgr);
    match shard.store.submit(txn).await {
        Ok(()) => {
            let mut held = pgr.held.borrow_mut();
            match version {
                Some(v) => held.insert(oid.to_owned(), v),
                None => held.remove(oid),
            };
            Ok(())
        }
        Err(e) => {
            let why = format!("rewriting {oid:?}: {e}");
            super::note_store_error(shard, &e);
            if e.kind != carmine_store::StoreErrorKind::NoSpace {
                // The store may hold half of it: this copy can no longer be trusted.
                fail(shard, pgr, why.clone());
            }
            Err(why)
        }
    }
}

/// Rewrites every bad copy `v` names from its good one.
async fn repair<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    epoch: u32,
    v: &Verdict,
) -> Result<(), String> {
    let pg = pgr.pg;
    let copy = match (v.want, v.source) {
        (None, _) => None,
        (Some(_), None) => return Err("no member holds a good copy".into()),
        (Some(_), Some(src)) if src == shard.osd => Some(
            pull::read_copy(&shard.store, pg, &v.oid)
                .await?
                .ok_or("the good copy vanished")?,
        ),
        (Some(want), Some(src)) => match pull::fetch(shard, pg, src, &v.oid).await {
            Some((version, Some(c))) if version == want => Some(c),
            Some((version, _)) => {
                return Err(format!("osd.{src} now holds version {version}, not {want}"))
            }
            None => return Err(format!("osd.{src} did not send its copy")),
        },
    };
    for (osd, _) in &v.bad {
        if *osd == shard.osd {
            install(shard, pgr, &v.oid, v.want, copy.clone(), epoch).await?;
            continue;
        }
        let mut replies = Replies::new(&shard.replication);
        let token = replies.expect(*osd);
        send(
            shard,
            *osd,
            pg,
            Body::Push {
                epoch,
                token,
                oid: v.oid.clone(),
                version: v.want.unwrap_or(Version::ZERO),
                copy: copy.clone(),
            },
        );
        match replies.wait().await.pop() {
            Some((_, Some(Body::Pushed { result: Ok(()), .. }))) => {}
            Some((
                _,
                Some(Body::Pushed {
                    result: Err(why), ..
                }),
            )) => return Err(format!("osd.{osd}: {why}")),
            _ => return Err(format!("osd.{osd} did not confirm the repair")),
        }
    }
    Ok(())
}

/// A read at the primary met a bad local copy of `oid`: rewrites it from a member that holds
/// it at the PG's version, with the PG's writes held back meanwhile. `Ok` once the local copy
/// is good again (the caller reads again).
pub(crate) async fn repair_for_read<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pg: PgId,
    oid: &str,
) -> Result<(), String> {
    let pgr = shard.replication.pg(pg).ok_or("no copy of the PG here")?;
    let _turn = pgr.gate.lock().await;
    let (epoch, acting, want) = {
        let m = pgr.member.borrow();
        (m.epoch(), m.acting().to_vec(), m.objects.get(oid).copied())
    };
    let Some(want) = want else {
        return Err("the PG holds no such object".into());
    };
    quiesce(&pgr, epoch, None).await.map_err(|e| e.message)?;
    for src in acting.into_iter().filter(|o| *o != shard.osd) {
        match pull::fetch(shard, pg, src, oid).await {
            Some((version, Some(copy))) if version == want => {
                install(shard, &pgr, oid, Some(want), Some(copy), epoch).await?;
                shard.metrics.read_repaired();
                tracing::warn!(%pg, oid, source = src, "bad local copy rewritten for a read");
                return Ok(());
            }
            other => {
                tracing::warn!(%pg, oid, source = src, got = ?other.map(|(v, c)| (v, c.is_some())),
                    "no good copy from this member for a read repair");
            }
        }
    }
    Err("no other member sent a good copy".into())
}

/// Runs the scheduled scrubs of the PGs this reactor is primary of, one at a time.
pub(crate) async fn run_schedule<S: ObjectStore + 'static>(weak: std::rc::Weak<Shard<S>>) {
    let every = {
        let Some(shard) = weak.upgrade() else { return };
        let s = shard.replication.scrub_schedule;
        [s.light, s.deep]
            .into_iter()
            .flatten()
            .min()
            .map_or(SCHEDULE_CHECK, |d| {
                d.clamp(SCHEDULE_CHECK_MIN, SCHEDULE_CHECK)
            })
    };
    loop {
        carmine_reactor::sleep(every).await;
        let Some(shard) = weak.upgrade() else { return };
        let now = Instant::now();
        let due: Vec<(PgId, ScrubMode)> = shard
            .replication
            .pgs
            .borrow()
            .values()
            .filter(|p| p.member.borrow().is_active_primary() && !p.scrub.running.get())
            .filter_map(|p| {
                if p.scrub.next_deep.get().is_some_and(|t| t <= now) {
                    Some((p.pg, ScrubMode::Deep))
                } else if p.scrub.next_light.get().is_some_and(|t| t <= now) {
                    Some((p.pg, ScrubMode::Light))
                } else {
                    None
                }
            })
            .collect();
        for (pg, mode) in due {
            if let Err(e) = scrub(&shard, pg, mode).await {
                tracing::info!(%pg, ?mode, "scheduled scrub did not complete: {}", e.message);
                // Not again at once: the PG may be peering, or a member slow.
                if let Some(p) = shard.replication.pg(pg) {
                    let later = Some(Instant::now() + RETRY_LATER);
                    match mode {
                        ScrubMode::Light => p.scrub.next_light.set(later),
                        _ => p.scrub.next_deep.set(later),
                    }
                }
            }
        }
    }
}
