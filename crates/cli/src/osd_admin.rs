//! `carmine osd out|in|lost|add|rm|reweight|reweight-by-capacity|balance|tree`: membership changes an operator makes, as map epochs, and the
//! view of OSDs by host. Changes are compare-and-swaps on the map store like the manager's,
//! so they never overwrite an epoch someone else committed meanwhile.

use anyhow::{bail, Context, Result};
use carmine_cluster::OsdMap;
use carmine_localcluster::DirArg;
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum OsdAdmin {
    /// Mark OSDs out: placement stops giving them PGs (their PGs move to other OSDs).
    Out {
        #[command(flatten)]
        dir: DirArg,
        ids: Vec<u32>,
        /// Move PGs of single-copy pools anyway (see `in`).
        #[arg(long)]
        allow_single_copy_moves: bool,
    },
    /// Mark OSDs in again: placement gives them PGs.
    In {
        #[command(flatten)]
        dir: DirArg,
        ids: Vec<u32>,
        /// Moving a PG of a pool that keeps one copy would leave its data behind: the PG
        /// would come up empty in its new place, and what it accepts there would be hidden
        /// once it moves back. So such PGs stay on the OSDs that hold them (placement
        /// exceptions), and a change that cannot keep them there (their OSD goes out) is
        /// refused — unless given this flag, which moves them anyway.
        #[arg(long)]
        allow_single_copy_moves: bool,
    },
    /// Declare down OSDs lost: their disks are gone for good. PGs stop waiting for their
    /// copies of the intervals recorded before now; writes only those copies held are then
    /// reported (incomplete PGs, unfound objects) for `pg mark-unfound-lost` to give up. The
    /// OSDs are also marked out, so their PGs are placed elsewhere.
    Lost {
        #[command(flatten)]
        dir: DirArg,
        ids: Vec<u32>,
        /// Needed: PGs may go on without writes only these OSDs held.
        #[arg(long)]
        yes_i_really_mean_it: bool,
    },
    /// Add an OSD on another host to the map (down until it registers; out unless --in).
    /// Start it there with the command this prints.
    Add {
        #[command(flatten)]
        dir: DirArg,
        /// The address its reactors listen on (the host's).
        #[arg(long)]
        host: std::net::IpAddr,
        /// The host's name, its failure domain [the address].
        #[arg(long)]
        host_name: Option<String>,
        /// Reactors (endpoints) [as the cluster's first OSD].
        #[arg(long)]
        reactors: Option<u32>,
        /// Reactor r of OSD n listens on port BASE + 16n + r.
        #[arg(long, default_value_t = 6800)]
        port_base: u16,
        /// Its share of PGs relative to the others: its capacity in TiB [the mean weight of
        /// the OSDs that are in; `osd reweight-by-capacity` sets it from what it registers].
        #[arg(long)]
        weight: Option<f64>,
        /// Mark it in at once: placement gives it PGs (see `in` for single-copy pools).
        #[arg(long = "in")]
        in_: bool,
        #[arg(long)]
        allow_single_copy_moves: bool,
    },
    /// Set an OSD's weight: its share of PGs relative to the others (0 takes none).
    Reweight {
        #[command(flatten)]
        dir: DirArg,
        id: u32,
        weight: f64,
        #[arg(long)]
        allow_single_copy_moves: bool,
    },
    /// Set the weight of every registered OSD from the capacity it registered (in TiB, as
    /// Ceph's CRUSH weights): OSDs of twice the size get twice the PGs.
    ReweightByCapacity {
        #[command(flatten)]
        dir: DirArg,
        /// Print what would change, change nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        allow_single_copy_moves: bool,
    },
    /// Remove an OSD that is down and out from the map.
    Rm {
        #[command(flatten)]
        dir: DirArg,
        id: u32,
    },
    /// Even out PGs per OSD with placement exceptions (Ceph's balancer in upmap mode): moves
    /// single PGs from the fullest OSDs to the emptiest until each is within
    /// --max-deviation PGs of its weighted share. PGs of single-copy pools are counted but
    /// not moved (unless --allow-single-copy-moves).
    Balance {
        #[command(flatten)]
        dir: DirArg,
        /// PGs an OSD may hold above or below its share.
        #[arg(long, default_value_t = 1)]
        max_deviation: usize,
        /// At most this many PGs move in one change.
        #[arg(long, default_value_t = 1000)]
        max_moves: usize,
        /// Print what would move, change nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        allow_single_copy_moves: bool,
    },
    /// Hosts and their OSDs, with up/down, in/out and PG counts.
    Tree {
        #[command(flatten)]
        dir: DirArg,
    },
}

pub fn run(cmd: OsdAdmin) -> Result<()> {
    match cmd {
        OsdAdmin::Out {
            dir,
            ids,
            allow_single_copy_moves,
        } => set_in(&dir.dir, &ids, false, allow_single_copy_moves),
        OsdAdmin::In {
            dir,
            ids,
            allow_single_copy_moves,
        } => set_in(&dir.dir, &ids, true, allow_single_copy_moves),
        OsdAdmin::Lost {
            dir,
            ids,
            yes_i_really_mean_it,
        } => set_lost(&dir.dir, &ids, yes_i_really_mean_it),
        OsdAdmin::Add {
            dir,
            host,
            host_name,
            reactors,
            port_base,
            weight,
            in_,
            allow_single_copy_moves,
        } => add(
            &dir.dir,
            NewOsd {
                host,
                host_name,
                reactors,
                port_base,
                weight: weight.map(fixed_weight).transpose()?,
                in_,
            },
            allow_single_copy_moves,
        ),
        OsdAdmin::Reweight {
            dir,
            id,
            weight,
            allow_single_copy_moves,
        } => reweight(&dir.dir, id, fixed_weight(weight)?, allow_single_copy_moves),
        OsdAdmin::Rm { dir, id } => rm(&dir.dir, id),
        OsdAdmin::ReweightByCapacity {
            dir,
            dry_run,
            allow_single_copy_moves,
        } => reweight_by_capacity(&dir.dir, dry_run, allow_single_copy_moves),
        OsdAdmin::Balance {
            dir,
            max_deviation,
            max_moves,
            dry_run,
            allow_single_copy_moves,
        } => balance(
            &dir.dir,
            max_deviation,
            max_moves,
            dry_run,
            allow_single_copy_moves,
        ),
        OsdAdmin::Tree { dir } => {
            let map = carmine_localcluster::read_map(&dir.dir)?;
            print!("{}", tree(&map));
            Ok(())
        }
    }
}

/// Keeps the PGs of one-copy pools that `next` would move where `map` has them (with `pin`,
/// by placement exceptions: their only copy cannot be copied along), unless `allow` (move
/// them anyway, the operator's choice); refuses if some would still move (their OSD goes
/// out, or without `pin`: the balancer, whose moves are the point).
fn keep_single_copies(
    map: &OsdMap,
    next: &mut OsdMap,
    allow: bool,
    pin: bool,
) -> Result<(), carmine_mapstore::MapStoreError> {
    if allow {
        return Ok(());
    }
    if pin {
        next.pin_single_copies(map);
    }
    let moved = map
        .single_copy_pgs()
        .filter(|pg| map.pg_placement(*pg, 1) != next.pg_placement(*pg, 1))
        .count();
    if moved > 0 {
        let names: Vec<&str> = (map.pools.iter())
            .filter(|p| p.size < 2)
            .map(|p| p.name.as_str())
            .collect();
        return Err(carmine_mapstore::MapStoreError::Invalid(format!(
            "this moves {moved} PGs of pool(s) {} that keep a single copy, off OSDs that \
             could no longer hold them: the moved PGs would come up empty on their new OSDs \
             (their data stays where it is, hidden), and writes they accept there would be \
             hidden once they move back. Only PGs of two copies or more carry their data \
             along (backfill); copy the volumes of such a pool into a pool of copies first \
             (`pool create --size`, `volume copy --to-pool`), or pass \
             --allow-single-copy-moves to do it anyway",
            names.join(", ")
        )));
    }
    Ok(())
}

/// `next` as the epoch after `map`, with the PGs of single-copy pools kept where their data
/// is (unless `allow_moves`; refused where they cannot be, see [`keep_single_copies`]).
/// The PGs it moves are served by their complete copies while the new ones are filled.
fn successor(
    map: &OsdMap,
    mut next: OsdMap,
    allow_moves: bool,
    pin: bool,
) -> Result<Option<OsdMap>, carmine_mapstore::MapStoreError> {
    keep_single_copies(map, &mut next, allow_moves, pin)?;
    next.prime_temps(map);
    next.epoch = map.epoch + 1;
    Ok(Some(next))
}

/// A weight in the map's 16.16 fixed point.
fn fixed_weight(w: f64) -> Result<u32> {
    if !(0.0..65536.0).contains(&w) {
        bail!("weight {w} is out of range (0 to 65535.99)");
    }
    Ok((w * carmine_cluster::WEIGHT_ONE as f64).round() as u32)
}

struct NewOsd {
    host: std::net::IpAddr,
    host_name: Option<String>,
    reactors: Option<u32>,
    port_base: u16,
    /// `None`: the mean weight of the OSDs that are in.
    weight: Option<u32>,
    in_: bool,
}

fn reweight(dir: &std::path::Path, id: u32, weight: u32, allow_moves: bool) -> Result<()> {
    let store = carmine_localcluster::map_store(dir)?;
    let mut before = None;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = existing(current)?;
        let mut next = map.clone();
        let Some(o) = next.osds.iter_mut().find(|o| o.id == id) else {
            return Err(carmine_mapstore::MapStoreError::Invalid(format!(
                "osd.{id} is not in the map"
            )));
        };
        if o.weight == weight {
            return Ok(None);
        }
        o.weight = weight;
        before = Some(map.clone());
        successor(map, next, allow_moves, true)
    })?
    .context("the cluster has no map")?;
    println!(
        "osd.{id} weight {:.4}; map epoch {}",
        weight as f64 / carmine_cluster::WEIGHT_ONE as f64,
        stored.epoch
    );
    print_moved(before.as_ref(), &stored);
    Ok(())
}

fn add(dir: &std::path::Path, new: NewOsd, allow_moves: bool) -> Result<()> {
    let NewOsd {
        host,
        host_name,
        reactors,
        port_base,
        weight,
        in_,
    } = new;
    let store = carmine_localcluster::map_store(dir)?;
    let mut before = None;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = existing(current)?;
        let id = map.osds.iter().map(|o| o.id + 1).max().unwrap_or(0);
        let n = reactors.unwrap_or_else(|| map.osds.first().map_or(1, |o| o.reactors.len() as u32));
        let ports = (0..n).map(|r| u32::from(port_base) + 16 * id + r);
        let mut endpoints = Vec::new();
        for p in ports {
            let p = u16::try_from(p).map_err(|_| {
                carmine_mapstore::MapStoreError::Invalid(format!(
                    "port {p} for osd.{id} is out of range: use a lower --port-base"
                ))
            })?;
            endpoints.push(std::net::SocketAddr::new(host, p));
        }
        if let Some(o) = map
            .osds
            .iter()
            .find(|o| o.reactors.iter().any(|a| endpoints.contains(a)))
        {
            return Err(carmine_mapstore::MapStoreError::Invalid(format!(
                "osd.{} already listens on one of {endpoints:?}",
                o.id
            )));
        }
        let name = host_name.clone().unwrap_or_else(|| host.to_string());
        let weight = weight.unwrap_or_else(|| mean_weight(map));
        let mut next = map.clone();
        next.osds.push(carmine_cluster::OsdInfo {
            up: false,
            in_,
            down_since: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            weight,
            ..carmine_cluster::OsdInfo::new(id, &name, endpoints)
        });
        before = Some(map.clone());
        successor(map, next, allow_moves, true)
    })?
    .context("the cluster has no map")?;
    let o = stored.osds.last().expect("just added");
    let eps: Vec<String> = o.reactors.iter().map(|a| a.to_string()).collect();
    println!(
        "added osd.{} on {} ({}), {}; map epoch {}",
        o.id,
        o.host,
        eps.join(" "),
        if o.in_ { "in" } else { "out" },
        stored.epoch
    );
    print_moved(before.as_ref(), &stored);
    let settings = carmine_localcluster::describe_map_source(dir)?;
    println!(
        "start it on that host with: carmine osd --id {} {settings} --no-pin",
        o.id
    );
    Ok(())
}

/// The mean weight of the OSDs that are in (1.0 when none is): what a new OSD gets unless
/// told, so it takes about its share rather than all or nothing.
fn mean_weight(map: &OsdMap) -> u32 {
    let weights: Vec<u64> = map
        .osds
        .iter()
        .filter(|o| o.in_ && o.weight > 0)
        .map(|o| u64::from(o.weight))
        .collect();
    if weights.is_empty() {
        return carmine_cluster::WEIGHT_ONE;
    }
    (weights.iter().sum::<u64>() / weights.len() as u64).max(1) as u32
}

fn reweight_by_capacity(dir: &std::path::Path, dry_run: bool, allow_moves: bool) -> Result<()> {
    let registered = carmine_localcluster::registrations(dir)?;
    let store = carmine_localcluster::map_store(dir)?;
    let mut before = None;
    let mut changes = Vec::new();
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = existing(current)?;
        let mut next = map.clone();
        changes.clear();
        for o in &mut next.osds {
            let Some(r) = registered.get(&o.id).filter(|r| r.capacity > 0) else {
                continue;
            };
            let w = carmine_cluster::weight_of_capacity(r.capacity);
            if w != o.weight {
                changes.push((o.id, o.weight, w, r.capacity));
                o.weight = w;
            }
        }
        before = Some(map.clone());
        if changes.is_empty() || dry_run {
            return Ok(None);
        }
        successor(map, next, allow_moves, true)
    })?
    .context("the cluster has no map")?;
    let one = carmine_cluster::WEIGHT_ONE as f64;
    for (id, from, to, bytes) in &changes {
        println!(
            "osd.{id}: {:.1} GiB registered, weight {:.4} -> {:.4}",
            *bytes as f64 / (1u64 << 30) as f64,
            *from as f64 / one,
            *to as f64 / one
        );
    }
    if changes.is_empty() {
        println!(
            "every registered OSD already weighs its capacity; map epoch {}",
            stored.epoch
        );
    } else if dry_run {
        println!("dry run: nothing changed; map epoch {}", stored.epoch);
    } else {
        println!("map epoch {}", stored.epoch);
        print_moved(before.as_ref(), &stored);
    }
    Ok(())
}

fn rm(dir: &std::path::Path, id: u32) -> Result<()> {
    refuse_while_histories_name(dir, id)?;
    let store = carmine_localcluster::map_store(dir)?;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = existing(current)?;
        let Some(o) = map.osd(id) else {
            return Err(carmine_mapstore::MapStoreError::Invalid(format!(
                "osd.{id} is not in the map"
            )));
        };
        if o.up || o.in_ {
            return Err(carmine_mapstore::MapStoreError::Invalid(format!(
                "osd.{id} is {} and {}: only an OSD that is down and out can be removed \
                 (stop it, and `osd out {id}` first)",
                if o.up { "up" } else { "down" },
                if o.in_ { "in" } else { "out" }
            )));
        }
        let mut next = map.clone();
        next.epoch = map.epoch + 1;
        next.osds.retain(|o| o.id != id);
        next.clean_upmaps();
        next.clean_temps();
        Ok(Some(next))
    })?
    .context("the cluster has no map")?;
    println!("removed osd.{id}; map epoch {}", stored.epoch);
    Ok(())
}

/// Refuses to remove an OSD that a PG's recorded history still names: the PG may need its
/// copy (it is not clean without it yet), and once the OSD is out of the map it could not be
/// waited for, nor declared lost, any more.
fn refuse_while_histories_name(dir: &std::path::Path, id: u32) -> Result<()> {
    let map = carmine_localcluster::read_map(dir)?;
    let histories = carmine_localcluster::pg_histories(dir)?;
    let naming: Vec<String> = carmine_localcluster::pgs_naming(&map, histories.as_ref(), id)?
        .iter()
        .map(|pg| pg.to_string())
        .collect();
    if naming.is_empty() {
        return Ok(());
    }
    let shown = naming.len().min(8);
    bail!(
        "osd.{id} is named by the recorded history of {} PG(s) ({}{}): they are not clean \
         without it yet and may need its copy. Wait until `cluster status` says HEALTH_OK; if \
         its disk is gone for good, `osd lost {id} --yes-i-really-mean-it` first, then `pg \
         mark-unfound-lost` for the PGs that wait",
        naming.len(),
        naming[..shown].join(", "),
        if naming.len() > shown { ", …" } else { "" }
    )
}

fn balance(
    dir: &std::path::Path,
    max_deviation: usize,
    max_moves: usize,
    dry_run: bool,
    allow_moves: bool,
) -> Result<()> {
    let store = carmine_localcluster::map_store(dir)?;
    let mut before = None;
    let mut plan = None;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = existing(current)?;
        let mut next = map.clone();
        // One-copy PGs stay where their data is unless the operator says otherwise.
        let done = next.balance_keeping(max_deviation, max_moves, !allow_moves);
        before = Some(map.clone());
        plan = Some((done, next.spread()));
        if next.upmaps == map.upmaps || dry_run {
            return Ok(None);
        }
        successor(map, next, allow_moves, false)
    })?
    .context("the cluster has no map")?;
    let (b, (done, after)) = (
        before.expect("the update ran"),
        plan.expect("the update ran"),
    );
    let spread = |s: &carmine_cluster::Spread| {
        format!(
            "min {} max {} mean {:.1}, max/mean {:.3}",
            s.min,
            s.max,
            s.mean,
            s.max_over_mean()
        )
    };
    println!("PGs per OSD before: {}", spread(&b.spread()));
    println!("PGs per OSD after:  {}", spread(&after));
    let verb = if dry_run { "would move" } else { "moved" };
    println!(
        "{verb} {} PGs ({} stale exceptions dropped); {} exceptions; map epoch {}",
        done.moved,
        done.cleaned,
        if dry_run {
            b.upmaps.len()
        } else {
            stored.upmaps.len()
        },
        stored.epoch
    );
    Ok(())
}

fn set_in(dir: &std::path::Path, ids: &[u32], in_: bool, allow_moves: bool) -> Result<()> {
    if ids.is_empty() {
        bail!("name at least one OSD id");
    }
    let store = carmine_localcluster::map_store(dir)?;
    let word = if in_ { "in" } else { "out" };
    let mut already = Vec::new();
    let mut before = None;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = existing(current)?;
        let mut next = map.clone();
        already.clear();
        for id in ids {
            let Some(o) = next.osds.iter_mut().find(|o| o.id == *id) else {
                return Err(carmine_mapstore::MapStoreError::Invalid(format!(
                    "osd.{id} is not in the map"
                )));
            };
            if o.in_ == in_ {
                already.push(format!("osd.{id}"));
            }
            o.in_ = in_;
            // An operator's decision: the manager does not undo it when the OSD comes back.
            o.auto_out = false;
        }
        if next == *map {
            return Ok(None);
        }
        keep_single_copies(map, &mut next, allow_moves, true)?;
        next.prime_temps(map);
        next.epoch = map.epoch + 1;
        before = Some(map.clone());
        if !next.osds.iter().any(|o| o.in_) {
            return Err(carmine_mapstore::MapStoreError::Invalid(
                "refusing to mark every OSD out: no PG would have a place".into(),
            ));
        }
        Ok(Some(next))
    })?
    .context("the cluster has no map")?;
    let names: Vec<String> = ids.iter().map(|i| format!("osd.{i}")).collect();
    print_moved(before.as_ref(), &stored);
    if already.len() == ids.len() {
        println!(
            "{} already {word}; map epoch {}",
            names.join(", "),
            stored.epoch
        );
    } else {
        println!(
            "marked {} {word}; map epoch {}",
            names.join(", "),
            stored.epoch
        );
    }
    Ok(())
}

/// `osd lost`: see [`OsdAdmin::Lost`].
fn set_lost(dir: &std::path::Path, ids: &[u32], confirmed: bool) -> Result<()> {
    if ids.is_empty() {
        bail!("name at least one OSD id");
    }
    if !confirmed {
        bail!(
            "declaring an OSD lost lets its PGs go on without the copies it held: writes only \
             it had are given up once `pg mark-unfound-lost` is run. If its disk may still \
             come back, start the OSD instead. Pass --yes-i-really-mean-it to declare it lost"
        );
    }
    // A process that still runs may hold a read lease, and serve: it must be gone first.
    let alive = carmine_localcluster::registrations(dir)?;
    if let Some(id) = ids.iter().find(|id| alive.contains_key(id)) {
        bail!(
            "osd.{id} is still registered as running (or its registration has not expired \
             yet): stop its process before declaring it lost"
        );
    }
    let store = carmine_localcluster::map_store(dir)?;
    let mut before = None;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = existing(current)?;
        let mut next = map.clone();
        next.epoch = map.epoch + 1;
        for id in ids {
            let Some(o) = next.osds.iter_mut().find(|o| o.id == *id) else {
                return Err(carmine_mapstore::MapStoreError::Invalid(format!(
                    "osd.{id} is not in the map"
                )));
            };
            if o.up {
                return Err(carmine_mapstore::MapStoreError::Invalid(format!(
                    "osd.{id} is up: only a down OSD can be declared lost (stop it, and wait \
                     until the map marks it down)"
                )));
            }
            // The intervals recorded up to now; an interval it serves after coming back is
            // its own to answer for.
            o.lost_at = next.epoch;
            o.in_ = false;
            o.auto_out = false;
        }
        if !next.osds.iter().any(|o| o.in_) {
            return Err(carmine_mapstore::MapStoreError::Invalid(
                "refusing to mark every OSD out: no PG would have a place".into(),
            ));
        }
        // One-copy PGs on other OSDs stay where their data is (their exceptions may name
        // the lost OSD's place in placement); those it held move, their data gone with it.
        // Moved PGs of copies are served by their complete copies while the new ones fill.
        next.pin_single_copies(map);
        next.prime_temps(map);
        before = Some(map.clone());
        Ok(Some(next))
    })?
    .context("the cluster has no map")?;
    print_moved(before.as_ref(), &stored);
    let names: Vec<String> = ids.iter().map(|i| format!("osd.{i}")).collect();
    println!(
        "declared {} lost and out; map epoch {}. PGs whose recorded intervals only they \
         could vouch for show as incomplete in `cluster status`: `carmine pg mark-unfound-lost \
         PGID` lets each go on without those writes",
        names.join(", "),
        stored.epoch
    );
    Ok(())
}

/// How many PGs a committed change placed elsewhere (`before`: the map it changed).
fn print_moved(before: Option<&OsdMap>, stored: &OsdMap) {
    if let Some(b) = before {
        let total = b.all_pgs().count();
        println!(
            "{} of {total} PGs placed elsewhere by this change",
            b.moved_pgs(stored)
        );
        let kept = stored
            .single_copy_pgs()
            .filter(|pg| stored.upmaps.get(pg) != b.upmaps.get(pg))
            .count();
        if kept > 0 {
            println!(
                "{kept} PGs of single-copy pools kept on the OSDs that hold them (placement \
                 exceptions): their only copy cannot move"
            );
        }
    }
}

/// The map a membership change starts from; there is none before `cluster up`.
fn existing(current: Option<&OsdMap>) -> Result<&OsdMap, carmine_mapstore::MapStoreError> {
    current.ok_or_else(|| carmine_mapstore::MapStoreError::Invalid("the cluster has no map".into()))
}

/// `ceph osd tree`: hosts, then their OSDs.
pub fn tree(map: &OsdMap) -> String {
    use std::fmt::Write;
    let mut hosts: Vec<&str> = map.osds.iter().map(|o| o.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let mut t = String::new();
    let _ = writeln!(t, "map epoch {}", map.epoch);
    let _ = writeln!(
        t,
        "{:<6} {:<24} {:>5} {:>4} {:>6} {:>8}",
        "ID", "NAME", "STATE", "IN", "PGS", "WEIGHT"
    );
    for h in hosts {
        let _ = writeln!(t, "{:<6} host {h}", "-");
        for o in map.osds.iter().filter(|o| o.host == h) {
            // PGs placed on it first, served or (while it is down) waiting for it.
            let pgs = map
                .all_pgs()
                .filter(|pg| {
                    let size = map.pool(pg.pool).map_or(1, |p| p.size);
                    map.pg_placement(*pg, size).first() == Some(&o.id)
                })
                .count();
            let _ = writeln!(
                t,
                "{:<6}     osd.{:<15} {:>5} {:>4} {:>6} {:>8.4}",
                o.id,
                o.id,
                match (o.up, o.lost_at) {
                    (true, _) => "up",
                    (false, 0) => "down",
                    (false, _) => "lost",
                },
                if o.in_ { "in" } else { "out" },
                pgs,
                o.weight as f64 / carmine_cluster::WEIGHT_ONE as f64
            );
        }
    }
    let s = map.spread();
    let _ = writeln!(
        t,
        "PGs per OSD in: min {} max {} mean {:.1}, max/mean {:.3}; {} placement exceptions \
         (osd balance)",
        s.min,
        s.max,
        s.mean,
        s.max_over_mean(),
        map.upmaps.len()
    );
    t
}
