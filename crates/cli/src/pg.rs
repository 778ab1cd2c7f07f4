//! `carmine pg scrub|deep-scrub|repair`: compare a PG's copies at its primary, and rewrite the
//! bad ones, on demand. Scheduled scrubs run in the OSDs on their own. `carmine pg
//! mark-unfound-lost`: give up the objects no copy holds, so their PG serves again. `carmine
//! pg map|temp`: where a PG is served, and a temporary acting set set by hand.

use crate::size::format_size;
use anyhow::{bail, Context, Result};
use carmine_client::Client;
use carmine_cluster::{OsdMap, Pool};
use carmine_localcluster::{connect, DirArg};
use carmine_proto::{ScrubMode, ScrubReport};
use carmine_types::PgId;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum PgCommand {
    /// Compare the copies' object lists, versions and sizes.
    Scrub(ScrubArgs),
    /// Also compare every copy's data, attributes and omap by checksum (reads every byte).
    DeepScrub(ScrubArgs),
    /// A deep scrub that rewrites each bad copy from a good one, then looks again.
    Repair(ScrubArgs),
    /// Give up the objects a PG waits for that no reachable copy holds (`cluster status`
    /// counts them as unfound): they are deleted, and the PG serves its other objects again.
    /// Their data is lost for good; bring back any OSD that may hold them first.
    MarkUnfoundLost(ScrubArgs),
    /// Where a PG is: its up set (placement), its acting set (which serves it) and the
    /// copies being filled.
    Map(MapArgs),
    /// Serve a PG from these OSDs, primary first, instead of its placement (Ceph's
    /// `pg-temp`): a temporary acting set, as the map writers make while a new copy is
    /// filled (decision 0015). With no OSD, the PG goes back to its placement; it also goes
    /// back on its own once the placement's copies outside the set hold everything.
    Temp(TempArgs),
}

#[derive(Args, Debug)]
pub struct MapArgs {
    /// The PG, as POOL.SEED with the seed in hex.
    pub pgid: String,
    #[command(flatten)]
    pub dir: DirArg,
}

#[derive(Args, Debug)]
pub struct TempArgs {
    /// The PG, as POOL.SEED with the seed in hex.
    pub pgid: String,
    /// The OSD ids, primary first; none to remove the PG's temporary acting set.
    pub osds: Vec<u32>,
    #[command(flatten)]
    pub dir: DirArg,
}

#[derive(Args, Debug)]
pub struct ScrubArgs {
    /// The PG, as POOL.SEED with the seed in hex (as `cluster status` and the logs print it).
    #[arg(required_unless_present = "pool")]
    pub pgid: Option<String>,
    /// Every PG of this pool instead of one.
    #[arg(long, conflicts_with = "pgid")]
    pub pool: Option<String>,
    #[command(flatten)]
    pub dir: DirArg,
}

fn parse_pgid(s: &str) -> Result<(u32, u32)> {
    let (pool, seed) = s
        .split_once('.')
        .with_context(|| format!("{s:?} is not a PG id: POOL.SEED, e.g. 1.1f"))?;
    Ok((
        pool.parse()
            .with_context(|| format!("{pool:?} is not a pool id"))?,
        u32::from_str_radix(seed, 16).with_context(|| format!("{seed:?} is not a hex PG seed"))?,
    ))
}

/// The PGs `args` names: one, or every PG of a pool.
fn named_pgs(client: &Client, args: &ScrubArgs) -> Result<Vec<(u32, u32)>> {
    Ok(match (&args.pgid, &args.pool) {
        (Some(id), _) => vec![parse_pgid(id)?],
        (None, Some(name)) => {
            let map = client.map();
            let pool = map.pool(client.pool_id(name)?)?;
            (0..pool.pg_num).map(|s| (pool.id, s)).collect()
        }
        (None, None) => bail!("give a PG id or --pool"),
    })
}

fn mark_unfound_lost(args: ScrubArgs) -> Result<()> {
    carmine_reactor::block_on(async move {
        let client = connect(&args.dir.dir).await?;
        let pgs = named_pgs(&client, &args)?;
        let mut total = 0;
        for (pool, seed) in pgs {
            let pg = carmine_types::PgId { pool, seed };
            match client.mark_unfound_lost(pool, seed).await {
                Ok(n) => {
                    // An incomplete PG gives up whole intervals, whose writes nobody can
                    // count: its figure is 0.
                    println!("pg {pg}: gave up what no copy holds ({n} unfound objects)");
                    total += n;
                }
                // With --pool, PGs that wait for nothing are simply skipped.
                Err(e)
                    if args.pool.is_some()
                        && e.status() == Some(carmine_proto::Status::InvalidArgument) => {}
                Err(e) => return Err(e).with_context(|| format!("pg {pg}")),
            }
        }
        if args.pool.is_some() {
            println!("{total} unfound objects given up");
        }
        Ok(())
    })
}

pub fn run(cmd: PgCommand) -> Result<()> {
    let (mode, args) = match cmd {
        PgCommand::Scrub(a) => (ScrubMode::Light, a),
        PgCommand::DeepScrub(a) => (ScrubMode::Deep, a),
        PgCommand::Repair(a) => (ScrubMode::Repair, a),
        PgCommand::MarkUnfoundLost(a) => return mark_unfound_lost(a),
        PgCommand::Map(a) => return show_map(&a),
        PgCommand::Temp(a) => return set_temp(&a),
    };
    carmine_reactor::block_on(async move {
        let client = connect(&args.dir.dir).await?;
        let pgs = named_pgs(&client, &args)?;
        let mut unrepaired = 0;
        let mut findings = 0;
        for (pool, seed) in &pgs {
            let r = scrub_one(&client, *pool, *seed, mode).await?;
            findings += r.findings_total;
            unrepaired += r.unrepaired();
        }
        if pgs.len() > 1 {
            println!(
                "{} PGs: {findings} bad copies found, {} repaired",
                pgs.len(),
                findings - unrepaired
            );
        }
        if unrepaired > 0 {
            bail!("{unrepaired} inconsistent copies left");
        }
        Ok(())
    })
}

async fn scrub_one(client: &Client, pool: u32, seed: u32, mode: ScrubMode) -> Result<ScrubReport> {
    let pg = carmine_types::PgId { pool, seed };
    let r = client
        .scrub(pool, seed, mode)
        .await
        .with_context(|| format!("scrubbing pg {pg}"))?;
    let what = match mode {
        ScrubMode::Light => "scrub",
        ScrubMode::Deep => "deep-scrub",
        ScrubMode::Repair => "repair",
    };
    let osds: Vec<String> = r.acting.iter().map(|o| format!("osd.{o}")).collect();
    println!(
        "pg {pg} {what} at epoch {} on {}: {} objects, {}; {}",
        r.epoch,
        osds.join(", "),
        r.objects,
        format_size(r.bytes),
        match (r.findings_total, r.unrepaired()) {
            (0, _) => "clean".to_string(),
            (n, 0) => format!("{n} bad copies, all repaired"),
            (n, left) => format!("{n} bad copies, {left} left: INCONSISTENT"),
        }
    );
    for f in &r.findings {
        println!(
            "  {} on osd.{}: {}{}",
            f.oid,
            f.osd,
            f.what,
            if f.repaired { " (repaired)" } else { "" }
        );
    }
    if r.findings_total > r.findings.len() as u64 {
        println!(
            "  … and {} more",
            r.findings_total - r.findings.len() as u64
        );
    }
    Ok(r)
}

/// A PG of `map`, checked against its pool.
fn pg_of(map: &OsdMap, pgid: &str) -> Result<(PgId, Pool)> {
    let (pool, seed) = parse_pgid(pgid)?;
    let p = map.pool(pool)?.clone();
    if seed >= p.pg_num {
        bail!(
            "pool {:?} has {} PGs: there is no pg {pgid}",
            p.name,
            p.pg_num
        );
    }
    Ok((PgId { pool, seed }, p))
}

fn describe(map: &OsdMap, pg: PgId, size: u8) -> String {
    let list = |v: Vec<u32>| format!("{v:?}");
    let mut line = format!(
        "pg {pg} (epoch {}): up {} acting {}",
        map.epoch,
        list(map.pg_up(pg, size)),
        list(map.pg_osds(pg, size))
    );
    let targets = map.pg_backfill_targets(pg, size);
    if !targets.is_empty() {
        line.push_str(&format!(" backfill targets {}", list(targets)));
    }
    if let Some(t) = map.pg_temp.get(&pg) {
        line.push_str(&format!(" (temporary acting set {})", list(t.clone())));
    }
    line
}

fn show_map(a: &MapArgs) -> Result<()> {
    let map = carmine_localcluster::read_map(&a.dir.dir)?;
    let (pg, pool) = pg_of(&map, &a.pgid)?;
    println!("{}", describe(&map, pg, pool.size));
    Ok(())
}

/// Why a temporary acting set `osds` for `pg` would be refused in `map`, if it would.
fn temp_refusal(map: &OsdMap, pg: PgId, pool: &Pool, osds: &[u32]) -> Option<String> {
    if pool.size == 1 {
        // Its only copy is on its placement's OSD; another would serve it without its data.
        return Some(format!(
            "pool {:?} keeps one copy: served elsewhere, pg {pg} would answer without its data",
            pool.name
        ));
    }
    if osds.len() > pool.size as usize {
        return Some(format!("pool {:?} keeps {} copies", pool.name, pool.size));
    }
    if let Some(id) = osds.iter().find(|id| map.osd(**id).is_none()) {
        return Some(format!("osd.{id} is not in the map"));
    }
    let up = osds
        .iter()
        .filter(|id| map.osd(**id).is_some_and(|o| o.up))
        .count();
    if up < pool.min_size as usize {
        return Some(format!(
            "{up} of those OSDs are up, and pool {:?} takes writes with {} (the PG would stop)",
            pool.name, pool.min_size
        ));
    }
    None
}

fn set_temp(a: &TempArgs) -> Result<()> {
    let store = carmine_localcluster::map_store(&a.dir.dir)?;
    let invalid = carmine_mapstore::MapStoreError::Invalid;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = current.ok_or_else(|| invalid("the cluster has no map".into()))?;
        let (pg, pool) = pg_of(map, &a.pgid).map_err(|e| invalid(format!("{e:#}")))?;
        let mut next = map.clone();
        // A set that says what placement says is no set (and would only force format 7).
        if a.osds.is_empty() || a.osds == map.pg_placement(pg, pool.size) {
            if next.pg_temp.remove(&pg).is_none() {
                return Ok(None);
            }
        } else {
            if let Some(why) = temp_refusal(map, pg, &pool, &a.osds) {
                return Err(invalid(why));
            }
            if map.pg_temp.get(&pg) == Some(&a.osds) {
                return Ok(None);
            }
            next.pg_temp.insert(pg, a.osds.clone());
        }
        next.epoch = map.epoch + 1;
        Ok(Some(next))
    })?
    .context("the cluster has no map")?;
    let (pg, pool) = pg_of(&stored, &a.pgid)?;
    println!("{}", describe(&stored, pg, pool.size));
    Ok(())
}
