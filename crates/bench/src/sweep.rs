//! The depth sweep shared by every target: for each workload, step through the queue depths,
//! measure each step (the target's job), sample the OSDs around it, and stop early when the
//! latency is out of control.

use crate::heuristics::EarlyExit;
use crate::procstat::{self, Sample, Sampler};
use crate::report::{Row, Run};
use crate::workload::{StepStats, Workload};
use crate::{ceiling, BenchArgs};
use anyhow::Result;
use std::net::SocketAddr;
use std::time::Duration;

/// What the sweep observes besides the target, and the timeline sampler running over it.
pub struct Observe {
    osd_pids: Vec<i32>,
    /// The OSDs' perf sockets (reactor busy/idle by their own account).
    perf_sockets: Vec<std::path::PathBuf>,
    /// The disk under the store, for /proc/diskstats deltas.
    disk: Option<(u32, u32)>,
    /// The loopback RPC ceiling server, measured after each step when present.
    ceiling: Option<SocketAddr>,
    sampler: Sampler,
}

impl Observe {
    /// Starts the half-second timeline sampler.
    pub fn start(
        osd_pids: Vec<i32>,
        perf_sockets: Vec<std::path::PathBuf>,
        disk: Option<(u32, u32)>,
        ceiling: Option<SocketAddr>,
    ) -> Self {
        let sampler = Sampler::start(
            osd_pids.clone(),
            perf_sockets.clone(),
            Duration::from_millis(500),
        );
        Observe {
            osd_pids,
            perf_sockets,
            disk,
            ceiling,
            sampler,
        }
    }

    fn finish(self) -> Vec<Sample> {
        self.sampler.finish()
    }
}

/// The whole run: the sweep, then the timeline, as the run's record (the sampler is stopped
/// whether or not the sweep succeeded).
pub async fn run(
    a: &BenchArgs,
    obs: Observe,
    step: impl AsyncFnMut(Workload, u64, usize) -> Result<StepStats>,
) -> Result<Run> {
    let rows = sweep(a, &obs, step).await;
    let timeline = obs.finish();
    let mut run = Run::new(a, rows?);
    run.timeline = timeline;
    Ok(run)
}

/// Runs every workload's depth sweep; `step(workload, block size, depth)` measures one step.
async fn sweep(
    a: &BenchArgs,
    obs: &Observe,
    mut step: impl AsyncFnMut(Workload, u64, usize) -> Result<StepStats>,
) -> Result<Vec<Row>> {
    let (ramp, run) = (
        Duration::from_secs_f64(a.ramp_secs),
        Duration::from_secs_f64(a.step_secs),
    );
    let early_exit = EarlyExit {
        max_cv: a.max_cv,
        max_mean_ms: a.max_latency_ms,
        cv_min_mean_ms: a.cv_min_latency_ms,
    };
    let mut rows = Vec::new();
    for &wl in &a.workloads {
        let bs = if wl.is_random() {
            a.random_bs
        } else {
            a.seq_bs
        };
        let depths = match (&a.depths, wl.is_random()) {
            (Some(d), _) => d.clone(),
            (None, true) => a.random_depths.clone(),
            (None, false) => a.seq_depths.clone(),
        };
        for depth in depths {
            obs.sampler.set_step(Some(rows.len()));
            let started_s = obs.sampler.elapsed();
            let before = procstat::snapshot(&obs.osd_pids, obs.disk);
            let reactors_before = procstat::ReactorCounters::read(&obs.perf_sockets);
            let stats = step(wl, bs, depth).await?;
            let reactors = procstat::ReactorCounters::read(&obs.perf_sockets);
            let usage = procstat::usage(
                &before,
                &procstat::snapshot(&obs.osd_pids, obs.disk),
                &obs.osd_pids,
            );
            let reactor_busy = reactors.busy_since(&reactors_before, usage.wall_secs);
            let ceiling = match obs.ceiling {
                Some(addr) => {
                    // The ceiling moves the same payload the step's I/O moves.
                    let (req, rep) = if wl.is_write() {
                        (bs as usize, 0)
                    } else {
                        (0, bs as usize)
                    };
                    Some(ceiling::measure(addr, req, rep, depth, ramp, run).await?)
                }
                None => None,
            };
            obs.sampler.set_step(None);
            eprintln!(
                "{:>9} {:>5} qd{:<3} {:>9.0} IOPS  mean {:>7.1} us{}",
                wl.name(),
                bs,
                depth,
                stats.iops,
                stats.lat_mean_us,
                if stats.verify_errors > 0 {
                    format!("  VERIFY ERRORS {}", stats.verify_errors)
                } else {
                    String::new()
                }
            );
            let stop = early_exit.reason(&stats);
            let mut row = Row::new(wl, bs, depth, stats, ceiling, usage);
            row.reactor_busy = reactor_busy;
            row.started_s = started_s;
            row.ended_s = obs.sampler.elapsed();
            rows.push(row);
            if let Some(why) = stop.filter(|_| !a.no_early_exit) {
                eprintln!("{:>9}: early exit after qd{depth}: {why}", wl.name());
                rows.last_mut().expect("just pushed").early_exit = Some(why);
                break;
            }
        }
    }
    Ok(rows)
}
