//! `carmine cluster up|down|status|perf`.

use anyhow::{Context, Result};
use carmine_localcluster::{down, perf_socket_path, read_map, status, up, DirArg, UpArgs};
use carmine_reactor::perf::read_perf_socket;
use clap::Subcommand;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Start OSD processes and write the cluster map, pids and logs under --dir.
    Up(Box<UpArgs>),
    /// Stop exactly the OSD processes started by `up` in --dir.
    Down(DirArg),
    /// Show the map and whether each OSD process and reactor answers.
    Status(DirArg),
    /// How busy each reactor is (its own loop's busy/idle time), over an interval.
    Perf {
        #[command(flatten)]
        dir: DirArg,
        /// Seconds per report.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Reports to print.
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
}

pub fn run(cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::Up(a) => {
            let running = up(&a)?;
            for line in &running.notes {
                println!("{line}");
            }
            Ok(())
        }
        ClusterCommand::Down(d) => {
            println!("{}", down(&d.dir)?);
            Ok(())
        }
        ClusterCommand::Status(d) => {
            let s = status(&d.dir)?;
            print!("{}", s.text);
            if s.health != carmine_localcluster::Health::Ok {
                anyhow::bail!("{}: {}", s.health.as_str(), s.reasons.join("; "));
            }
            Ok(())
        }
        ClusterCommand::Perf {
            dir,
            interval,
            count,
        } => perf(&dir.dir, interval, count),
    }
}

/// Reads every OSD's perf socket `count` times, `interval` apart, and prints each reactor's
/// busy share and wake-ups per second in between.
fn perf(dir: &std::path::Path, interval: f64, count: u32) -> Result<()> {
    let map = read_map(dir)?;
    let ids: Vec<u32> = map.osds.iter().map(|o| o.id).collect();
    let read_all = || -> Result<Vec<_>> {
        ids.iter()
            .map(|&id| {
                let p = perf_socket_path(dir, id);
                read_perf_socket(&p).with_context(|| format!("osd.{id}: {}", p.display()))
            })
            .collect()
    };
    let mut before = (Instant::now(), read_all()?);
    for _ in 0..count {
        std::thread::sleep(Duration::from_secs_f64(interval.max(0.01)));
        let after = (Instant::now(), read_all()?);
        let secs = (after.0 - before.0).as_secs_f64();
        for (b, a) in before.1.iter().zip(&after.1) {
            for (rb, ra) in b.reactors.iter().zip(&a.reactors) {
                let s = ra.load.share_since(&rb.load);
                println!(
                    "{:<10} busy {:>5.1}% (tasks {:>5.1}%, io_uring kernel work {:>5.1}%)  polling {:>5.1}%  idle {:>5.1}%  wake-ups/s {:>8.0}",
                    ra.name,
                    s.busy_pct,
                    s.tasks_pct,
                    s.kernel_pct,
                    s.polled_pct,
                    s.idle_pct,
                    ra.load.sleeps.saturating_sub(rb.load.sleeps) as f64 / secs
                );
            }
        }
        before = after;
    }
    Ok(())
}
