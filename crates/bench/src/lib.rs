//! The performance lab (first cut): I/O through the client against a local cluster, step by
//! step over workloads and queue depths, side by side with the loopback RPC ceiling measured
//! in the same run, and OSD CPU time per I/O sampled from /proc.

mod ceiling;
pub mod charts;
pub mod compare;
mod fio;
mod heuristics;
mod machine;
mod plan;
mod procstat;
mod report;
pub mod workload;

use anyhow::{Context, Result};
use bytes::Bytes;
use carmine_localcluster::{parse_size, DirArg, UpArgs};
use carmine_reactor::cpu::{pin_current_thread, CpuPolicy};
use carmine_volume::Volumes;
use clap::Args;
use futures::stream::{self, StreamExt, TryStreamExt};
use report::{Row, Run};
use std::path::PathBuf;
use std::time::Duration;
use workload::{run_on_image_observed, Workload};

/// What generates the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The built-in load generator through Carmine's own client.
    Carmine,
    /// fio's nbd engine against `carmine nbd serve` exporting the benchmark volume.
    FioNbd,
}

/// Work on finished runs instead of measuring.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchAction {
    /// Put runs side by side: IOPS and mean latency per step, ratios to the first run.
    Compare {
        /// Run directories (or their results.json).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Also write compare.md and the overlaid charts (SVG and PNG) into this directory.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Run a test plan: every combination of stores × CPU policies × OSD counts × reactor
    /// counts from a TOML file, each on a fresh cluster, then one side-by-side report.
    Plan {
        /// The plan (see bench/plans/policies.toml).
        file: PathBuf,
        /// Directory for the runs and plan.md (default: carmine-bench/plan-TIMESTAMP).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Exit non-zero when a run lost IOPS or gained latency beyond a tolerance.
    Check {
        /// The reference run.
        #[arg(long)]
        baseline: PathBuf,
        /// The run to check.
        run: PathBuf,
        /// Allowed change, in percent.
        #[arg(long, default_value_t = 5.0)]
        tolerance_pct: f64,
    },
}

#[derive(Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub action: Option<BenchAction>,
    /// Load generator: the built-in client, or fio through the NBD gateway.
    #[arg(long, value_enum, default_value = "carmine")]
    pub target: Target,
    /// Workloads to run, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "randread,randwrite,seqread,seqwrite"
    )]
    pub workloads: Vec<Workload>,
    /// Queue depths (I/Os in flight) for every workload; overrides the two lists below.
    #[arg(long, value_delimiter = ',')]
    pub depths: Option<Vec<usize>>,
    /// Queue depths of the random workloads (the seeds' sweep).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,24,32,40,52,64"
    )]
    pub random_depths: Vec<usize>,
    /// Queue depths of the sequential workloads.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub seq_depths: Vec<usize>,
    /// Stop a workload's sweep once clat stdev/mean reaches this.
    #[arg(long, default_value_t = 0.5)]
    pub max_cv: f64,
    /// Stop a workload's sweep once mean clat exceeds this many milliseconds.
    #[arg(long, default_value_t = 20.0)]
    pub max_latency_ms: f64,
    /// The stdev/mean test applies only to steps whose mean clat is at least this (ms).
    #[arg(long, default_value_t = 1.0)]
    pub cv_min_latency_ms: f64,
    /// Run every depth even when a step crossed the early-exit limits.
    #[arg(long)]
    pub no_early_exit: bool,
    /// Report the deepest queue whose p99.9 latency stays under this many milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub latency_target_ms: f64,
    /// Block size of the random workloads.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub random_bs: u64,
    /// Block size of the sequential workloads.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub seq_bs: u64,
    /// Measured seconds per step.
    #[arg(long, default_value_t = 3.0)]
    pub step_secs: f64,
    /// Unmeasured warm-up seconds before each step.
    #[arg(long, default_value_t = 1.0)]
    pub ramp_secs: f64,
    /// Size of the benchmark volume (prefilled before reads).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub volume_size: u64,
    /// Core(s) for the OSD reactor(s).
    #[arg(long, default_value = "1")]
    pub osd_cpu: String,
    /// Core for the load generator.
    #[arg(long, default_value_t = 0)]
    pub client_cpu: u32,
    /// Reactors per OSD.
    #[arg(long, default_value_t = 1)]
    pub reactors: u32,
    /// OSD processes.
    #[arg(long, default_value_t = 1)]
    pub osds: u32,
    /// Reactor placement policy over the OSD cpu set: default, osd or socket.
    #[arg(long, default_value = "default")]
    pub cpu_policy: CpuPolicy,
    /// The OSD's object store: memory, or native (a backing file in the run directory).
    #[arg(long, default_value = "memory")]
    pub store: String,
    /// Native store: backing file size (default: twice the volume, at least 2 GiB).
    #[arg(long, value_parser = parse_size)]
    pub device_size: Option<u64>,
    /// Native store: acknowledge on O_DIRECT completion, without fdatasync.
    #[arg(long)]
    pub no_fsync: bool,
    /// Skip the loopback RPC ceiling steps.
    #[arg(long)]
    pub no_ceiling: bool,
    /// Half-minute smoke run: 1 s steps, 0.2 s ramp, 64 MiB volume, depths 1, 16, 64.
    #[arg(long)]
    pub quick: bool,
    /// Report directory (default: carmine-bench/<date>-<time>).
    #[arg(long)]
    pub output: Option<PathBuf>,
}

pub fn run(mut a: BenchArgs) -> Result<()> {
    match a.action.take() {
        Some(BenchAction::Plan { file, output }) => return plan::run_plan(&file, output),
        Some(BenchAction::Compare { runs, output }) => {
            let mut md = compare::compare(&runs)?;
            if let Some(dir) = output {
                md += &compare::compare_charts(&dir, &runs)?;
                std::fs::write(dir.join("compare.md"), &md)?;
                eprintln!("comparison: {}", dir.join("compare.md").display());
            }
            print!("{md}");
            return Ok(());
        }
        Some(BenchAction::Check {
            baseline,
            run,
            tolerance_pct,
        }) => {
            let problems = compare::check(&baseline, &run, tolerance_pct)?;
            if problems.is_empty() {
                println!(
                    "ok: every step within {tolerance_pct}% of {}",
                    baseline.display()
                );
                return Ok(());
            }
            for p in &problems {
                println!("REGRESSION {p}");
            }
            anyhow::bail!(
                "{} step(s) regressed beyond {tolerance_pct}%",
                problems.len()
            );
        }
        None => {}
    }
    if a.quick {
        a.step_secs = 1.0;
        a.ramp_secs = 0.2;
        a.volume_size = a.volume_size.min(64 << 20);
        a.depths.get_or_insert_with(|| vec![1, 16, 64]);
    }
    let out_dir = a
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from("carmine-bench").join(machine::timestamp()));
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let cluster_dir = out_dir.join("cluster");
    let up = UpArgs {
        dir: DirArg {
            dir: cluster_dir.clone(),
        },
        osds: a.osds,
        reactors: a.reactors,
        store: a.store.clone(),
        memory_limit: (a.volume_size * 2).max(1 << 30),
        device_size: a.device_size.unwrap_or((a.volume_size * 2).max(2 << 30)),
        no_fsync: a.no_fsync,
        exe: None,
        cpu_policy: a.cpu_policy,
        cpu_set: Some(a.osd_cpu.clone()),
        no_pin: false,
        pool: "rbd".into(),
        pg_num: 64,
        host: [127, 0, 0, 1].into(),
    };
    let running = carmine_localcluster::up(&up)?;
    let result = bench_against(&a, &running);
    running.down()?;
    let run = result?;
    let json = serde_json::to_string_pretty(&run)?;
    std::fs::write(out_dir.join("results.json"), &json)?;
    let charts = write_charts(&out_dir, &serde_json::from_str(&json)?);
    let md = report::markdown(&run) + &charts;
    std::fs::write(out_dir.join("report.md"), &md)?;
    println!("{md}");
    println!("report: {}", out_dir.join("report.md").display());
    if run.rows.iter().any(|r| r.carmine.errors > 0) {
        anyhow::bail!("some I/Os failed; see the errors column");
    }
    Ok(())
}

fn bench_against(a: &BenchArgs, running: &carmine_localcluster::Running) -> Result<Run> {
    let osd_pids = carmine_localcluster::osd_pids(&running.dir)?;
    let disk = procstat::disk_of(&running.dir);
    let osd_cpu = carmine_reactor::cpu::parse_cpu_list(&a.osd_cpu)?
        .first()
        .copied();
    let ceiling_addr = if a.no_ceiling || a.target != Target::Carmine {
        None
    } else {
        Some(ceiling::start_server(osd_cpu)?)
    };
    if let Err(e) = pin_current_thread(a.client_cpu) {
        eprintln!(
            "warning: cannot pin the client to cpu {}: {e}",
            a.client_cpu
        );
    }
    let ramp = Duration::from_secs_f64(a.ramp_secs);
    let step = Duration::from_secs_f64(a.step_secs);
    let dir = running.dir.clone();
    let sampler = procstat::Sampler::start(osd_pids.clone(), Duration::from_millis(500));
    let run = carmine_reactor::block_on(async {
        let client = carmine_localcluster::connect(&dir).await?;
        let pool = client.pool_id("rbd")?;
        let volumes = Volumes::new(client, pool);
        let info = volumes.create("bench", a.volume_size, None).await?;
        let image = volumes.open(&info.name).await?;
        prefill(&image).await?;
        let gateway = match a.target {
            Target::FioNbd => Some(NbdGateway::start(&dir)?),
            Target::Carmine => None,
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
            let early_exit = heuristics::EarlyExit {
                max_cv: a.max_cv,
                max_mean_ms: a.max_latency_ms,
                cv_min_mean_ms: a.cv_min_latency_ms,
            };
            for depth in depths {
                sampler.set_step(Some(rows.len()));
                let started_s = sampler.elapsed();
                let before = procstat::snapshot(&osd_pids, disk);
                let stats = match &gateway {
                    None => {
                        let bar = step_progress(&format!("{} {}K qd{depth}", wl.name(), bs >> 10));
                        let s =
                            run_on_image_observed(&image, wl, bs, depth, ramp, step, &bar).await;
                        bar.finish_and_clear();
                        s
                    }
                    // fio is a separate process; this thread just waits for it.
                    Some(g) => fio::run_nbd(&g.uri, a.volume_size, wl, bs, depth, ramp, step)?,
                };
                let usage =
                    procstat::usage(&before, &procstat::snapshot(&osd_pids, disk), &osd_pids);
                let ceiling = match ceiling_addr {
                    Some(addr) => {
                        let (req, rep) = if wl.is_write() {
                            (bs as usize, 0)
                        } else {
                            (0, bs as usize)
                        };
                        Some(ceiling::measure(addr, req, rep, depth, ramp, step).await?)
                    }
                    None => None,
                };
                eprintln!(
                    "{:>9} {:>5} qd{:<3} {:>9.0} IOPS  mean {:>7.1} us",
                    wl.name(),
                    bs,
                    depth,
                    stats.iops,
                    stats.lat_mean_us
                );
                sampler.set_step(None);
                let stop = early_exit.reason(&stats);
                let mut row = Row::new(wl, bs, depth, stats, ceiling, usage);
                row.started_s = started_s;
                row.ended_s = sampler.elapsed();
                if let Some(why) = stop.filter(|_| !a.no_early_exit) {
                    eprintln!("{:>9}: early exit after qd{depth}: {why}", wl.name());
                    row.early_exit = Some(why);
                    rows.push(row);
                    break;
                }
                rows.push(row);
            }
        }
        Ok(Run::new(&a, rows))
    });
    let timeline = sampler.finish();
    run.map(|mut r: Run| {
        r.timeline = timeline;
        r
    })
}

/// The run's charts next to its report, as a markdown section linking them. A chart that
/// cannot be drawn is reported, not fatal: the numbers are already saved.
fn write_charts(dir: &std::path::Path, run: &serde_json::Value) -> String {
    let label = run["store"].as_str().unwrap_or("run").to_string();
    let mut pngs = match charts::latency_charts(dir, &[(label, run.clone())]) {
        Ok(p) => p,
        Err(e) => return format!("\nCharts not drawn: {e:#}\n"),
    };
    match charts::usage_chart(dir, run) {
        Ok(p) => pngs.extend(p),
        Err(e) => return format!("\nUsage chart not drawn: {e:#}\n"),
    }
    charts_section(dir, &pngs)
}

/// Markdown image links to `pngs`, relative to `dir` (SVG beside each).
fn charts_section(dir: &std::path::Path, pngs: &[PathBuf]) -> String {
    charts::markdown_links(dir, pngs, "SVG beside each PNG.")
}

/// Writes the whole volume once so reads measure real data, not holes.
async fn prefill(image: &carmine_volume::Image) -> Result<()> {
    const CHUNK: u64 = 4 << 20;
    let data = Bytes::from(vec![0x5au8; CHUNK as usize]);
    let size = image.size();
    stream::iter((0..size).step_by(CHUNK as usize))
        .map(|off| {
            let data = data.slice(..CHUNK.min(size - off) as usize);
            async move { image.write(off, data).await }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// `carmine nbd serve` for the benchmark volume, as a child process that inherits this
/// thread's cpu pinning (the client cpu).
struct NbdGateway {
    child: std::process::Child,
    uri: String,
}

impl NbdGateway {
    fn start(cluster_dir: &std::path::Path) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let listen = format!("127.0.0.1:{port}");
        let exe = std::env::current_exe()?;
        let child = std::process::Command::new(exe)
            .args([
                "nbd", "serve", "--export", "bench", "--listen", &listen, "--dir",
            ])
            .arg(cluster_dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("starting the NBD gateway")?;
        let mut g = NbdGateway {
            child,
            uri: format!("nbd://{listen}/bench"),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&listen).is_err() {
            if g.child.try_wait()?.is_some() || std::time::Instant::now() > deadline {
                anyhow::bail!("the NBD gateway did not start on {listen}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(g)
    }
}

impl Drop for NbdGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bar for one step: fills over ramp + step, with live IOPS in its message. Drawn only when
/// stderr is a terminal.
fn step_progress(label: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(1000).with_style(
        indicatif::ProgressStyle::with_template("{msg:>36} [{bar:30}] {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(label.to_string());
    bar
}
