//! The performance lab (first cut): I/O through the client against a local cluster, step by
//! step over workloads and queue depths, side by side with the loopback RPC ceiling measured
//! in the same run, and OSD CPU time per I/O sampled from /proc.

mod ceiling;
mod ceph;
pub mod charts;
pub mod compare;
mod fio;
mod heuristics;
mod machine;
mod plan;
mod procstat;
mod report;
mod sweep;
pub mod verify;
pub mod workload;

use anyhow::{Context, Result};
use bytes::Bytes;
use carmine_localcluster::{parse_size, DirArg, UpArgs};
use carmine_reactor::cpu::{pin_current_thread, CpuPolicy};
use carmine_volume::Volumes;
use clap::Args;
use futures::stream::{self, StreamExt, TryStreamExt};
use report::Run;
use std::path::PathBuf;
use std::time::Duration;
use workload::{run_load, Distribution, Load, Mix, Workload};

/// What generates the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The built-in load generator through Carmine's own client.
    Carmine,
    /// fio's nbd engine against `carmine nbd serve` exporting the benchmark volume.
    FioNbd,
    /// fio with fio-carmine, the engine on libcarmine: the client inside fio, as fio-rbd runs
    /// librbd (build it first: `cargo build --release -p carmine-capi`, then
    /// `crates/capi/fio/build.sh target/release`).
    FioCarmine,
    /// fio's rbd engine (librbd) against Ceph: a throw-away single-node cluster from Debian's
    /// packages (bench/ceph/vstart-ceph.sh, built in), or an existing one (`--ceph-conf`).
    FioRbd,
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
    /// Size of each benchmark volume (prefilled before the steps).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub volume_size: u64,
    /// Volumes, each driven by its own jobs (built-in generator).
    #[arg(long, default_value_t = 1)]
    pub volumes: u32,
    /// Jobs per volume, each keeping the step's queue depth in flight (fio's numjobs).
    #[arg(long, default_value_t = 1)]
    pub jobs_per_volume: usize,
    /// Read share of the randrw workload, in percent.
    #[arg(long, default_value_t = 70, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub rwmix_read: u32,
    /// Where random I/O lands: uniform, zipf[:THETA] (default 1.2), normal[:STDEV_PCT]
    /// (default 10).
    #[arg(long, default_value = "uniform")]
    pub distribution: Distribution,
    /// Check every read against the last acknowledged write (built-in generator only; costs
    /// client CPU, so not for peak numbers). Any mismatch fails the run.
    #[arg(long)]
    pub verify: bool,
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
    /// Copies of every object (the pool's size; min_size is size - size/2). On one machine the
    /// copies share its cores: compare CPU per I/O.
    #[arg(long, default_value_t = 1)]
    pub size: u8,
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
    #[arg(long, conflicts_with = "dsync")]
    pub no_fsync: bool,
    /// Microseconds an idle reactor polls before it sleeps, in the OSDs and in the built-in
    /// client. Default: the client does not poll; the OSDs poll as `osd run` does by
    /// default (50 µs where each reactor has a core of its own), or not at all when their
    /// cores include the client's.
    #[arg(long)]
    pub idle_poll_us: Option<u64>,
    /// Native store: journal writes in flight per shard (default: the OSDs' own, 1).
    #[arg(long)]
    pub journal_writes: Option<u32>,
    /// Native store: object bodies kept in memory per shard (default: the OSDs' own, 64M).
    #[arg(long, value_parser = carmine_localcluster::parse_size)]
    pub object_cache: Option<u64>,
    /// Native store: metadata tree nodes kept in memory per shard (default: the OSDs' own, 64M).
    #[arg(long, value_parser = carmine_localcluster::parse_size)]
    pub metadata_cache: Option<u64>,
    /// Native store: pace the background cleaner to this many bytes per second while
    /// clients use the store (default: the OSDs' own, no pacing).
    #[arg(long, value_parser = carmine_localcluster::parse_cleaner_rate)]
    pub cleaner_rate: Option<u64>,
    /// Native store: O_DSYNC journal writes (FUA where the device has it) instead of a
    /// separate fdatasync; still power-loss durable.
    #[arg(long)]
    pub dsync: bool,
    /// fio-rbd: the Ceph OSD's object store for the throw-away cluster.
    #[arg(long, default_value = "bluestore", value_parser = ["bluestore", "memstore"])]
    pub ceph_store: String,
    /// fio-carmine's engine (`--target fio-carmine`): default libfio_carmine.so beside this
    /// program.
    #[arg(long)]
    pub fio_carmine_engine: Option<PathBuf>,
    /// fio-rbd: use the existing Ceph cluster this ceph.conf describes instead of a throw-away
    /// one (its local ceph-osd processes are sampled).
    #[arg(long)]
    pub ceph_conf: Option<PathBuf>,
    /// fio-rbd: the pool of the benchmark images.
    #[arg(long, default_value = "rbd")]
    pub ceph_pool: String,
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
    if let Some(us) = a.idle_poll_us {
        carmine_reactor::set_idle_poll(std::time::Duration::from_micros(us));
    }
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
    a.validate()?;
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let run = if a.target == Target::FioRbd {
        ceph::bench(&a, &out_dir.join("ceph"))?
    } else {
        bench_carmine(&a, &out_dir.join("cluster"))?
    };
    let json = serde_json::to_string_pretty(&run)?;
    std::fs::write(out_dir.join("results.json"), &json)?;
    let charts = write_charts(&out_dir, &serde_json::from_str(&json)?);
    let md = report::markdown(&run) + &charts;
    std::fs::write(out_dir.join("report.md"), &md)?;
    println!("{md}");
    println!("report: {}", out_dir.join("report.md").display());
    let errors: u64 = run.rows.iter().map(|r| r.carmine.errors).sum();
    let wrong: u64 = run.rows.iter().map(|r| r.carmine.verify_errors).sum();
    if wrong > 0 {
        anyhow::bail!("{wrong} read(s) returned data other than the last acknowledged write");
    }
    if errors > 0 {
        anyhow::bail!("{errors} I/O(s) failed; see the errors column");
    }
    Ok(())
}

impl BenchArgs {
    pub fn mix(&self) -> Mix {
        Mix {
            read_pct: self.rwmix_read,
            distribution: self.distribution,
        }
    }

    /// Combinations that cannot be measured honestly are refused up front.
    fn validate(&self) -> Result<()> {
        if self.target != Target::Carmine {
            if self.verify {
                anyhow::bail!("--verify needs the built-in generator (--target carmine)");
            }
            if self.volumes != 1 {
                anyhow::bail!("fio targets drive one volume (use --jobs-per-volume)");
            }
            if self.target == Target::FioCarmine
                && self.jobs_per_volume > 1
                && self
                    .workloads
                    .iter()
                    .any(|w| w.is_write() || *w == Workload::Randrw)
            {
                anyhow::bail!(
                    "fio-carmine: each writing job holds its volume's exclusive lock, so \
                     writes need --jobs-per-volume 1 (raise --depths instead)"
                );
            }
        }
        if self.volumes == 0 || self.jobs_per_volume == 0 {
            anyhow::bail!("--volumes and --jobs-per-volume must be at least 1");
        }
        if self.verify
            && !(self.random_bs.is_multiple_of(verify::BLOCK)
                && self.seq_bs.is_multiple_of(verify::BLOCK))
        {
            anyhow::bail!("--verify needs block sizes in multiples of 4K");
        }
        Ok(())
    }
}

/// A fresh local Carmine cluster in `cluster_dir`, benchmarked, then taken down.
fn bench_carmine(a: &BenchArgs, cluster_dir: &std::path::Path) -> Result<Run> {
    let up = UpArgs {
        dir: DirArg {
            dir: cluster_dir.to_path_buf(),
        },
        osds: Some(a.osds),
        reactors: Some(a.reactors),
        store: Some(a.store.clone()),
        memory_limit: Some((a.volume_size * 2).max(1 << 30)),
        device_size: Some(a.device_size.unwrap_or((a.volume_size * 2).max(2 << 30))),
        no_fsync: a.no_fsync,
        dsync: a.dsync,
        fsync: !a.no_fsync && !a.dsync,
        exe: None,
        cpu_policy: Some(a.cpu_policy),
        cpu_set: Some(a.osd_cpu.clone()),
        no_pin: false,
        pin: true,
        recovery_rate_mib: None,
        recovery_busy_rate_mib: None,
        recovery_max_active: None,
        backfill_min_objects: None,
        idle_poll_us: osd_idle_poll(a)?,
        journal_writes: a.journal_writes,
        object_cache: a.object_cache,
        metadata_cache: a.metadata_cache,
        cleaner_rate: a.cleaner_rate,
        reset_osd_settings: false,
        pool: Some("rbd".into()),
        pg_num: Some(64),
        size: Some(a.size),
        min_size: None,
        host: [127, 0, 0, 1].into(),
        etcd: None,
        with_etcd: false,
        etcd_access: Default::default(),
        managers: None,
        lease_ttl: None,
        down_out_grace: None,
        peer_grace: None,
        report_hold: None,
    };
    // Each run gets a new cluster: one left in this directory by an earlier run goes.
    carmine_localcluster::forget(cluster_dir)?;
    let running = carmine_localcluster::up(&up)?;
    for line in &running.notes {
        println!("{line}");
    }
    let result = bench_against(a, &running);
    println!("{}", running.down()?);
    // The cluster was made for this run: its (sparse, device-sized) native store files go, its
    // map and logs stay.
    for id in 0..a.osds {
        let _ = std::fs::remove_file(carmine_localcluster::store_path(cluster_dir, id));
    }
    result
}

/// The OSDs' `--idle-poll-us`: as given; 0 when they run on the client's core (a poller
/// there takes turns from the client); else their own default.
fn osd_idle_poll(a: &BenchArgs) -> Result<Option<u64>> {
    let osd_cpus = carmine_reactor::cpu::parse_cpu_list(&a.osd_cpu)?;
    Ok(a.idle_poll_us
        .or(osd_cpus.contains(&a.client_cpu).then_some(0)))
}

fn bench_against(a: &BenchArgs, running: &carmine_localcluster::Running) -> Result<Run> {
    let osd_pids = carmine_localcluster::osd_pids(&running.dir)?;
    let osd_cpu = carmine_reactor::cpu::parse_cpu_list(&a.osd_cpu)?
        .first()
        .copied();
    let ceiling_addr = if a.no_ceiling || a.target != Target::Carmine {
        None
    } else {
        Some(ceiling::start_server(osd_cpu)?)
    };
    pin_client(a);
    let (ramp, step) = (
        Duration::from_secs_f64(a.ramp_secs),
        Duration::from_secs_f64(a.step_secs),
    );
    let dir = running.dir.clone();
    carmine_reactor::block_on(async {
        let client = carmine_localcluster::connect(&dir).await?;
        let pool = client.pool_id("rbd")?;
        let volumes = Volumes::new(client, pool);
        let mut images = Vec::new();
        for v in 0..a.volumes {
            let name = volume_name(v);
            volumes.create(&name, a.volume_size, None).await?;
            images.push(volumes.open(&name).await?);
        }
        for image in &images {
            prefill(image, a.verify).await?;
        }
        let verifiers: Option<Vec<verify::Verifier>> = a.verify.then(|| {
            images
                .iter()
                .map(|i| verify::Verifier::new(i.size()))
                .collect()
        });
        let fio = match a.target {
            Target::FioNbd | Target::FioCarmine => {
                // The gateway, or fio's own client, takes the volumes' exclusive locks: give
                // them up first.
                for image in images.drain(..) {
                    image.close().await?;
                }
                Some(match a.target {
                    Target::FioNbd => {
                        let g = NbdGateway::start(&dir, a.idle_poll_us)?;
                        (fio::Fio::nbd(&g.uri), Some(g))
                    }
                    _ => (
                        fio::Fio::carmine(&fio_carmine_engine(a)?, &dir, "bench"),
                        None,
                    ),
                })
            }
            _ => None,
        };
        let perf_sockets: Vec<PathBuf> = (0..a.osds)
            .map(|id| carmine_localcluster::perf_socket_path(&dir, id))
            .collect();
        let obs = sweep::Observe::start(
            osd_pids,
            perf_sockets,
            procstat::disk_of(&dir),
            ceiling_addr,
        );
        sweep::run(a, obs, async |wl, bs, depth| match &fio {
            None => {
                let bar = step_progress(&format!("{} {}K qd{depth}", wl.name(), bs >> 10));
                let load = Load {
                    images: &images,
                    jobs: a.jobs_per_volume,
                    wl,
                    mix: a.mix(),
                    bs,
                    depth,
                    verifiers: verifiers.as_deref(),
                };
                let s = run_load(&load, ramp, step, &bar).await;
                bar.finish_and_clear();
                Ok(s)
            }
            // fio is a separate process; this thread just waits for it.
            Some((fio, _gateway)) => fio.step(a, wl, bs, depth),
        })
        .await
    })
    .map(|mut run| {
        run.osd_idle_poll_us = osd_idle_polls(&dir, a.osds);
        run
    })
}

/// Each OSD's idle poll in µs, as its log says it chose (`osd.N: idle poll X µs (why)`);
/// an OSD whose log does not say is left out.
fn osd_idle_polls(dir: &std::path::Path, osds: u32) -> Vec<(u32, u64)> {
    (0..osds)
        .filter_map(|id| {
            let log = std::fs::read_to_string(dir.join(format!("osd.{id}.log"))).ok()?;
            let prefix = format!("osd.{id}: idle poll ");
            let us = log
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix(&prefix))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some((id, us))
        })
        .collect()
}

/// fio-carmine's engine: as given, or beside this program; missing, it says how to build it.
fn fio_carmine_engine(a: &BenchArgs) -> Result<PathBuf> {
    let path = match &a.fio_carmine_engine {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the program's directory")?
            .join("libfio_carmine.so"),
    };
    if !path.exists() {
        anyhow::bail!(
            "no fio-carmine engine at {}: build it with `cargo build --release -p carmine-capi \
             && crates/capi/fio/build.sh target/release`, or pass --fio-carmine-engine",
            path.display()
        );
    }
    Ok(path)
}

/// The load generator (and fio, its child) run on the client cpu, away from the OSDs.
fn pin_client(a: &BenchArgs) {
    if let Err(e) = pin_current_thread(a.client_cpu) {
        eprintln!(
            "warning: cannot pin the client to cpu {}: {e}",
            a.client_cpu
        );
    }
}

/// The benchmark volumes: `bench`, then `bench-1`, `bench-2`, ... (the NBD target exports
/// `bench`).
fn volume_name(index: u32) -> String {
    if index == 0 {
        "bench".into()
    } else {
        format!("bench-{index}")
    }
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
    charts::markdown_links(dir, &pngs, "SVG beside each PNG.")
}

/// Writes the whole volume once so reads measure real data, not holes; in verify mode, with
/// every block's generation-0 pattern.
async fn prefill(image: &carmine_volume::Image, verify: bool) -> Result<()> {
    const CHUNK: u64 = 4 << 20;
    let data = Bytes::from(vec![0x5au8; CHUNK as usize]);
    let size = image.size();
    stream::iter((0..size).step_by(CHUNK as usize))
        .map(|off| {
            let len = CHUNK.min(size - off);
            let data = if verify {
                verify::blocks_at(off / verify::BLOCK, len.div_ceil(verify::BLOCK), 0)
                    .slice(..len as usize)
            } else {
                data.slice(..len as usize)
            };
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
    fn start(cluster_dir: &std::path::Path, idle_poll_us: Option<u64>) -> Result<Self> {
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
            .args(idle_poll_us.map(|us| format!("--idle-poll-us={us}")))
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
