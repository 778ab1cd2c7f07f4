//! `cluster status`: a summary that reads like `ceph -s` (health with its reasons, the map
//! epoch and where it lives, managers, OSDs up/in, PGs by state, space used as the OSDs'
//! metrics report it), then each OSD and reactor as found by pinging it.

use crate::{live_osds, managers, map_path, ping, read_cluster_file, store_kind};
use anyhow::{Context, Result};
use carmine_cluster::OsdMap;
use std::fmt::Write;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    Ok,
    Warn,
    Err,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "HEALTH_OK",
            Health::Warn => "HEALTH_WARN",
            Health::Err => "HEALTH_ERR",
        }
    }
}

/// The cluster's state as text, and its health.
pub struct Status {
    pub text: String,
    pub health: Health,
    /// The reasons for a health other than OK, one line each.
    pub reasons: Vec<String>,
    pub epoch: u32,
}

#[derive(Default)]
struct Checks {
    health: Option<Health>,
    reasons: Vec<String>,
}

impl Checks {
    fn add(&mut self, h: Health, why: String) {
        self.health = Some(self.health.map_or(h, |now| now.max(h)));
        self.reasons.push(why);
    }
}

/// Space figures summed over OSDs, from their metrics.
#[derive(Default)]
struct Usage {
    capacity: u64,
    used: u64,
    objects: u64,
    osds: usize,
    /// PGs whose last scrub left a bad copy, counted by their primaries.
    inconsistent: u64,
    /// Replicated PGs by state as their primaries report them, and recovery's figures.
    active: u64,
    peering: u64,
    to_recover: u64,
    unfound: u64,
    /// Objects the backfill targets still lack (copies being filled).
    misplaced: u64,
    /// PGs waiting as incomplete: every copy of some recorded interval came back empty.
    incomplete: u64,
    /// PGs waiting for down OSDs of their recorded intervals.
    down: u64,
    /// Active PGs whose primary has gone more than a read lease without hearing all copies.
    unleased: u64,
    recovered_objects: u64,
    recovered_bytes: u64,
    /// Recovery's pace over the OSDs' last ten seconds.
    recovery_bytes_per_sec: f64,
    recovery_objects_per_sec: f64,
    /// The largest peering listing of any PG (bytes): the most of any reactor, not a sum.
    listing_max: u64,
    /// Reactors whose store refused a change for want of room lately.
    refused_room: u64,
}

impl Usage {
    fn add(&mut self, o: &Usage) {
        self.capacity += o.capacity;
        self.used += o.used;
        self.objects += o.objects;
        self.osds += o.osds;
        self.inconsistent += o.inconsistent;
        self.active += o.active;
        self.peering += o.peering;
        self.to_recover += o.to_recover;
        self.misplaced += o.misplaced;
        self.unfound += o.unfound;
        self.incomplete += o.incomplete;
        self.down += o.down;
        self.unleased += o.unleased;
        self.recovered_objects += o.recovered_objects;
        self.recovered_bytes += o.recovered_bytes;
        self.recovery_bytes_per_sec += o.recovery_bytes_per_sec;
        self.recovery_objects_per_sec += o.recovery_objects_per_sec;
        self.listing_max = self.listing_max.max(o.listing_max);
        self.refused_room += o.refused_room;
    }
}

/// Ceph's defaults: warn when the busiest OSD is 85% full, error at 95% (writes then fail
/// with NoSpace one by one).
const NEARFULL: f64 = 0.85;
const FULL: f64 = 0.95;
/// One OSD's figures summed over its reactors, read from its Prometheus endpoint; `None` if it
/// does not answer.
fn scrape_usage(addr: &str) -> Option<Usage> {
    let text = ureq::get(&format!("http://{addr}/metrics"))
        .timeout(std::time::Duration::from_secs(1))
        .call()
        .ok()?
        .into_string()
        .ok()?;
    let sum_f = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let sum = |name: &str| -> u64 { sum_f(name) as u64 };
    Some(Usage {
        capacity: sum("carmine_osd_store_capacity_bytes"),
        used: sum("carmine_osd_store_used_bytes"),
        objects: sum("carmine_osd_store_objects"),
        osds: 1,
        inconsistent: sum("carmine_osd_pgs_inconsistent"),
        active: sum("carmine_osd_pgs_active"),
        peering: sum("carmine_osd_pgs_peering"),
        to_recover: sum("carmine_osd_objects_to_recover"),
        misplaced: sum("carmine_osd_objects_misplaced"),
        unfound: sum("carmine_osd_objects_unfound"),
        incomplete: sum("carmine_osd_pgs_incomplete"),
        down: sum("carmine_osd_pgs_down"),
        unleased: sum("carmine_osd_pgs_read_lease_lapsed"),
        recovered_objects: sum("carmine_osd_recovered_objects_total"),
        recovered_bytes: sum("carmine_osd_recovered_bytes_total"),
        recovery_bytes_per_sec: sum_f("carmine_osd_recovery_bytes_per_second"),
        recovery_objects_per_sec: sum_f("carmine_osd_recovery_objects_per_second"),
        listing_max: text
            .lines()
            .filter(|l| l.starts_with("carmine_osd_pg_peering_listing_bytes_max{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0),
        refused_room: sum("carmine_osd_store_refused_room"),
    })
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// PGs by what the map says of their copies, over all pools: inactive (no OSD placed for
/// them is up, or fewer than the pool's `min_size`: they take no request) and undersized
/// (enough up to serve, fewer than `size`: a further failure may stop them).
fn pg_copies(map: &OsdMap) -> (usize, usize) {
    let (mut inactive, mut undersized) = (0, 0);
    for pg in map.all_pgs() {
        let Ok(pool) = map.pool(pg.pool) else {
            continue;
        };
        let up = map.pg_osds(pg, pool.size).len();
        if up == 0 || up < pool.min_size as usize {
            inactive += 1;
        } else if up < pool.size as usize {
            undersized += 1;
        }
    }
    (inactive, undersized)
}

pub fn status(dir: &Path) -> Result<Status> {
    let dir = std::fs::canonicalize(dir)
        .with_context(|| format!("no cluster directory {}", dir.display()))?;
    let map = crate::read_map(&dir)?;
    let etcd = read_cluster_file(&dir)?.and_then(|f| f.etcd);
    let live = live_osds(&dir)?;
    let key = crate::read_key(&dir)?;
    let mut checks = Checks::default();
    let mut detail = String::new();
    let mut answering = 0;
    let mut usage = Usage::default();
    for o in &map.osds {
        let pid = live.iter().find(|(id, _)| *id == o.id).map(|(_, p)| *p);
        let metrics_addr = std::fs::read_to_string(crate::metrics_path(&dir, o.id))
            .ok()
            .map(|a| a.trim().to_owned());
        let metrics = metrics_addr
            .as_ref()
            .map(|a| format!(", metrics http://{a}/metrics"))
            .unwrap_or_default();
        if let Some(this) = metrics_addr
            .as_deref()
            .filter(|_| pid.is_some())
            .and_then(scrape_usage)
        {
            usage.add(&this);
            let (cap, used) = (this.capacity, this.used);
            let full = if cap == 0 {
                0.0
            } else {
                used as f64 / cap as f64
            };
            if this.refused_room > 0 {
                checks.add(
                    Health::Err,
                    format!(
                        "osd.{} is full: its store refused a write for want of room ({:.0}% \
                         used); writes that would grow it are refused until space is freed",
                        o.id,
                        full * 100.0
                    ),
                );
            } else if full >= FULL {
                checks.add(
                    Health::Err,
                    format!(
                        "osd.{} is full ({:.0}%): writes to it fail",
                        o.id,
                        full * 100.0
                    ),
                );
            } else if full >= NEARFULL {
                checks.add(
                    Health::Warn,
                    format!("osd.{} is nearly full ({:.0}%)", o.id, full * 100.0),
                );
            }
        }
        writeln!(
            detail,
            "  osd.{}: {}{}",
            o.id,
            pid.map_or("NOT RUNNING".to_string(), |p| format!("running, pid {p}")),
            if pid.is_some() { metrics.as_str() } else { "" }
        )?;
        let mut dead = 0;
        for (r, addr) in o.reactors.iter().enumerate() {
            let pgs = map.pgs_of_reactor(o.id, r as u32).len();
            match ping(*addr, key.as_ref()) {
                Ok(rtt) => writeln!(
                    detail,
                    "    reactor {r} {addr}: up, {pgs} PGs, ping {} us",
                    rtt.as_micros()
                )?,
                Err(e) => {
                    dead += 1;
                    let e = format!("{e:#}");
                    let state = if e.contains("store shard failed") {
                        "UNHEALTHY"
                    } else {
                        "DOWN"
                    };
                    writeln!(detail, "    reactor {r} {addr}: {state} ({e})")?;
                }
            }
        }
        if dead == 0 {
            answering += 1;
        }
        // The map's view (etcd clusters: the managers') and what answers may disagree for
        // up to a lease TTL; both are reported.
        if o.up && dead > 0 {
            checks.add(
                Health::Warn,
                format!(
                    "osd.{} is marked up but {dead} of its {} reactor(s) do not answer",
                    o.id,
                    o.reactors.len()
                ),
            );
        }
    }
    let down: Vec<String> = map
        .osds
        .iter()
        .filter(|o| !o.up)
        .map(|o| format!("osd.{}", o.id))
        .collect();
    if !down.is_empty() {
        checks.add(
            Health::Warn,
            format!("{} osds down ({})", down.len(), down.join(", ")),
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for o in map.osds.iter().filter(|o| o.down_on_reports()) {
        let when = if o.held_down_until > now {
            format!("for {} s more", o.held_down_until - now)
        } else {
            "past its hold, until it says it runs (hung?)".into()
        };
        checks.add(
            Health::Warn,
            format!(
                "osd.{} is held down on its peers' failure reports {when} (time {} in a row)",
                o.id, o.report_markdowns
            ),
        );
    }
    // Reports of OSDs' current runs about OSDs still up: what the managers judge next.
    match managers::failure_reports(&dir, etcd.as_ref()) {
        Ok(reports) => {
            for r in reports.values() {
                let live_run = live
                    .iter()
                    .any(|(id, pid)| *id == r.reporter && *pid == r.pid as i32)
                    || etcd.is_some();
                let silent: Vec<String> = r
                    .silent_ms
                    .iter()
                    .filter(|(t, _)| map.osd(**t).is_some_and(|o| o.up))
                    .map(|(t, ms)| format!("osd.{t} (silent {:.1} s)", *ms as f64 / 1000.0))
                    .collect();
                if live_run && !silent.is_empty() && map.osd(r.reporter).is_some_and(|o| o.up) {
                    checks.add(
                        Health::Warn,
                        format!(
                            "osd.{} reports it cannot hear from {}",
                            r.reporter,
                            silent.join(", ")
                        ),
                    );
                }
            }
        }
        Err(e) => checks.add(Health::Warn, format!("reading failure reports: {e:#}")),
    }
    let (inactive, undersized) = pg_copies(&map);
    let total: usize = map.pools.iter().map(|p| p.pg_num as usize).sum();
    if inactive > 0 {
        let h = if inactive == total {
            Health::Err
        } else {
            Health::Warn
        };
        checks.add(
            h,
            format!(
                "Reduced data availability: {inactive} pgs inactive (fewer of their OSDs up \
                 than the pool's min_size)"
            ),
        );
    }
    if undersized > 0 {
        checks.add(
            Health::Warn,
            format!(
                "Degraded data redundancy: {undersized} pgs undersized (fewer copies up than \
                 the pool's size)"
            ),
        );
    }
    // Peering after a change lasts moments: it is shown on the PG states line, not judged
    // as health. Recovery runs in the background while PGs serve, and may take long: objects
    // with fewer copies than their pool keeps are a warning, with recovery's pace.
    if usage.to_recover > 0 {
        let (bps, ops) = (usage.recovery_bytes_per_sec, usage.recovery_objects_per_sec);
        let eta = if ops > 0.0 {
            format!(
                ", about {:.0} s left",
                (usage.to_recover as f64 / ops).ceil()
            )
        } else {
            String::new()
        };
        checks.add(
            Health::Warn,
            format!(
                "Degraded data redundancy: {} objects lack a copy on some OSD; recovering at \
                 {:.1} MiB/s, {:.1} objects/s over the last 10 s{eta}",
                usage.to_recover,
                bps / (1u64 << 20) as f64,
                ops
            ),
        );
    }
    // Copies being filled while complete ones serve (decision 0015): nothing is at risk, but
    // data moves until the temporary acting sets go (Ceph's OBJECT_MISPLACED).
    let temps = map
        .pg_temp
        .keys()
        .filter(|pg| map.pool(pg.pool).is_ok())
        .count();
    if temps > 0 || usage.misplaced > 0 {
        checks.add(
            Health::Warn,
            format!(
                "Data movement: {temps} pgs served by temporary acting sets while their new \
                 copies are filled; {} objects misplaced (still to copy there)",
                usage.misplaced
            ),
        );
    }
    if usage.unfound > 0 {
        checks.add(
            Health::Err,
            format!(
                "Reduced data availability: {} objects unfound: their PGs wait, peering, for \
                 an OSD that holds them (start the OSDs that are down; the primaries' logs \
                 name the PGs)",
                usage.unfound
            ),
        );
    }
    if usage.incomplete > 0 {
        checks.add(
            Health::Err,
            format!(
                "Reduced data availability: {} pgs incomplete: every copy of some of their \
                 recorded intervals came back empty (lost disks), so their writes are gone; \
                 the PGs wait for `carmine pg mark-unfound-lost PGID` to go on without them",
                usage.incomplete
            ),
        );
    }
    if usage.down > 0 {
        checks.add(
            Health::Warn,
            format!(
                "Reduced data availability: {} pgs down: they wait for OSDs that are down and \
                 may hold writes of their recorded intervals (the primaries' logs name them); \
                 start those OSDs, or declare one whose disk is gone for good with `carmine \
                 osd lost ID`",
                usage.down
            ),
        );
    }
    if usage.unleased > 0 {
        checks.add(
            Health::Warn,
            format!(
                "Slow or broken links between OSDs: {} pgs' primaries have not heard from all \
                 their copies for longer than the read lease (their reads wait, and so do \
                 writes; the primaries' logs name the silent OSDs)",
                usage.unleased
            ),
        );
    }
    // Peering sends a PG's whole object list in one message (until backfill by scan), in
    // parts when it outgrows a frame; a copy that takes the PG's history stores it in one
    // transaction, which the native store keeps within one journal segment.
    let (limit, what) = match store_kind(&dir).as_deref() {
        Some("native") => (
            u64::from(carmine_nativestore::DEFAULT_SEGMENT_SIZE),
            "one native-store transaction holds",
        ),
        _ => (
            carmine_proto::peer_parts::PEER_MESSAGE_MAX as u64,
            "one message between OSDs holds",
        ),
    };
    if usage.listing_max > limit / 2 {
        checks.add(
            if usage.listing_max > limit * 9 / 10 {
                Health::Err
            } else {
                Health::Warn
            },
            format!(
                "A PG lists {:.1} MiB of objects and log in its peering messages, of the {:.1} \
                 MiB {what}: past it the PG cannot peer or recover (spread the objects over \
                 more PGs: a pool with a larger pg_num)",
                usage.listing_max as f64 / (1u64 << 20) as f64,
                limit as f64 / (1u64 << 20) as f64
            ),
        );
    }
    if usage.inconsistent > 0 {
        checks.add(
            Health::Err,
            format!(
                "Possible data damage: {} pgs inconsistent (the OSD logs name the objects; \
                 `carmine pg repair PGID` rewrites the bad copies)",
                usage.inconsistent
            ),
        );
    }
    let mut mgr_line = String::new();
    if let Some(plan) = read_cluster_file(&dir)?.and_then(|f| managers::Plan::of(&dir, &f)) {
        let running = managers::live(&dir).len();
        match managers::leader(&dir, etcd.as_ref()) {
            Ok(Some(name)) => {
                mgr_line = format!("{name} leads; {running} of {} running", plan.count)
            }
            Ok(None) => {
                mgr_line = format!("no leader; {running} of {} running", plan.count);
                if plan.count > 0 {
                    checks.add(
                        Health::Warn,
                        "no manager leads: OSD failures are not noticed".into(),
                    );
                }
            }
            Err(err) => {
                mgr_line = format!("unknown ({err})");
                checks.add(Health::Warn, format!("{err}"));
            }
        }
        if (running as u32) < plan.count && plan.count > 0 {
            checks.add(
                Health::Warn,
                format!("{running} of {} managers running", plan.count),
            );
        }
    }
    let health = checks.health.unwrap_or(Health::Ok);
    let mut t = String::new();
    writeln!(t, "cluster {}", dir.display())?;
    writeln!(t, "  health: {}", health.as_str())?;
    for r in &checks.reasons {
        writeln!(t, "          {r}")?;
    }
    match &etcd {
        Some(e) => writeln!(t, "  map in {}", e.describe())?,
        None => writeln!(t, "  map in {}", map_path(&dir).display())?,
    }
    writeln!(t, "  map epoch {}", map.epoch)?;
    if !mgr_line.is_empty() {
        writeln!(t, "  mgr: {mgr_line}")?;
    }
    let up = map.osds.iter().filter(|o| o.up).count();
    let in_ = map.osds.iter().filter(|o| o.in_).count();
    let lost: Vec<String> = map
        .osds
        .iter()
        .filter(|o| o.lost_at != 0)
        .map(|o| format!("osd.{} in epoch {}", o.id, o.lost_at))
        .collect();
    writeln!(
        t,
        "  osd: {} osds: {up} up, {in_} in; {answering} answering{}",
        map.osds.len(),
        if lost.is_empty() {
            String::new()
        } else {
            format!("; declared lost: {}", lost.join(", "))
        }
    )?;
    for p in &map.pools {
        writeln!(
            t,
            "  pool {} {:?}: pg_num {}, size {}, min_size {}",
            p.id, p.name, p.pg_num, p.size, p.min_size
        )?;
    }
    writeln!(
        t,
        "  pgs: {total} total: {} active ({undersized} undersized), {inactive} inactive",
        total - inactive
    )?;
    if usage.osds > 0 && map.pools.iter().any(|p| p.size > 1) {
        writeln!(
            t,
            "  pg states (as their primaries report): {} active, {} peering, {} inconsistent; \
             {} objects to recover, {} misplaced, {} recovered ({}) since the OSDs started",
            usage.active,
            usage.peering,
            usage.inconsistent,
            usage.to_recover,
            usage.misplaced,
            usage.recovered_objects,
            gib(usage.recovered_bytes),
        )?;
    }
    if usage.osds > 0 {
        writeln!(
            t,
            "  usage: {} used of {} ({:.1}%), {} objects (from {} of {} OSDs)",
            gib(usage.used),
            gib(usage.capacity),
            100.0 * usage.used as f64 / usage.capacity.max(1) as f64,
            usage.objects,
            usage.osds,
            map.osds.len()
        )?;
    }
    t.push_str(&detail);
    Ok(Status {
        text: t,
        health,
        reasons: checks.reasons,
        epoch: map.epoch,
    })
}
