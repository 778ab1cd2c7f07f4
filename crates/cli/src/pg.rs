//! `carmine pg scrub|deep-scrub|repair`: compare a PG's copies at its primary, and rewrite the
//! bad ones, on demand. Scheduled scrubs run in the OSDs on their own. `carmine pg
//! mark-unfound-lost`: give up the objects no copy holds, so their PG serves again.

use crate::size::format_size;
use anyhow::{bail, Context, Result};
use carmine_client::Client;
use carmine_localcluster::{connect, DirArg};
use carmine_proto::{ScrubMode, ScrubReport};
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
