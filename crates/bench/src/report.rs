//! Run records and the markdown report.

use crate::machine::Machine;
use crate::procstat::Usage;
use crate::workload::{StepStats, Workload};
use crate::BenchArgs;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub workload: Workload,
    pub bs: u64,
    pub depth: usize,
    pub carmine: StepStats,
    pub ceiling: Option<StepStats>,
    /// OSD process CPU seconds per wall second over the step (ramp included).
    pub osd_cpu_cores: f64,
    pub osd_cpu_us_per_io: f64,
    /// Set on the step after which the sweep stopped, with the reason.
    pub early_exit: Option<String>,
    /// CPU (per OSD thread too), OSD memory and client CPU over the step.
    pub usage: Usage,
    /// When the step (ramp included) began and ended, in seconds on the run's clock (the
    /// timeline's).
    pub started_s: f64,
    pub ended_s: f64,
    /// Each reactor's busy share over the step (ramp included), by its own loop's account.
    pub reactor_busy: Vec<crate::procstat::ReactorBusy>,
}

impl Row {
    /// `usage` was sampled over the whole step, ramp included; the I/O rate is taken as steady
    /// over that window.
    pub fn new(
        workload: Workload,
        bs: u64,
        depth: usize,
        carmine: StepStats,
        ceiling: Option<StepStats>,
        usage: Usage,
    ) -> Self {
        let osd_cpu_cores = (usage.osd_usr_pct + usage.osd_sys_pct) / 100.0;
        let osd_cpu_us_per_io = if carmine.iops > 0.0 {
            osd_cpu_cores * 1e6 / carmine.iops
        } else {
            0.0
        };
        Row {
            early_exit: None,
            workload,
            bs,
            depth,
            carmine,
            ceiling,
            osd_cpu_cores,
            osd_cpu_us_per_io,
            usage,
            started_s: 0.0,
            ended_s: 0.0,
            reactor_busy: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub carmine_version: &'static str,
    pub target: crate::Target,
    pub machine: Machine,
    pub step_secs: f64,
    pub ramp_secs: f64,
    pub volume_size: u64,
    pub osd_cpu: String,
    pub client_cpu: u32,
    pub reactors: u32,
    pub osds: u32,
    /// Copies of every object (the pool's size).
    pub size: u8,
    pub cpu_policy: String,
    /// `memory`, or `native` (with `fsync` false when acknowledged without fdatasync).
    pub store: String,
    pub fsync: bool,
    /// With `fsync`: O_DSYNC journal writes instead of a separate fdatasync.
    pub dsync: bool,
    /// `--idle-poll-us`: microseconds idle reactors (OSDs and built-in client) poll before
    /// sleeping (`None`: the client does not, the OSDs by their default).
    pub idle_poll_us: Option<u64>,
    /// What each OSD chose, by its log: (id, µs).
    pub osd_idle_poll_us: Vec<(u32, u64)>,
    /// Native store: journal writes in flight per shard, if not the OSDs' default.
    pub journal_writes: Option<u32>,
    /// Native store: object cache bytes per shard, if not the OSDs' default.
    pub object_cache: Option<u64>,
    /// Native store: metadata cache bytes per shard, if not the OSDs' default.
    #[serde(default)]
    pub metadata_cache: Option<u64>,
    /// Native store: the background cleaner's pace in bytes per second while clients use
    /// the store, if given.
    #[serde(default)]
    pub cleaner_rate: Option<u64>,
    pub latency_target_ms: f64,
    pub rows: Vec<Row>,
    /// OSD and client usage sampled every half second over the sweep (after the prefill).
    pub timeline: Vec<crate::procstat::Sample>,
    /// The command line that made this run.
    pub command: Vec<String>,
    pub fio_version: Option<String>,
    /// The random-access shape (randrw read share, distribution) and load shape.
    pub mix: crate::workload::Mix,
    pub volumes: u32,
    pub jobs_per_volume: usize,
    pub verify: bool,
    /// Set when the target was Ceph (fio-rbd).
    pub ceph: Option<CephInfo>,
}

/// The Ceph cluster a fio-rbd run measured.
#[derive(Clone, Debug, Serialize)]
pub struct CephInfo {
    /// bluestore or memstore (throw-away cluster), or "existing cluster".
    pub store: String,
    pub version: String,
    pub throwaway: bool,
    /// The throw-away cluster's OSDs and its pool's copies (an existing cluster's: unknown).
    pub osds: Option<u32>,
    pub size: Option<u8>,
    /// Whether tcmalloc was preloaded into the throw-away cluster's OSDs (Debian's are built
    /// without it).
    pub tcmalloc: Option<bool>,
}

impl Run {
    pub fn new(a: &BenchArgs, rows: Vec<Row>) -> Self {
        Run {
            carmine_version: env!("CARGO_PKG_VERSION"),
            target: a.target,
            machine: Machine::read(),
            step_secs: a.step_secs,
            ramp_secs: a.ramp_secs,
            volume_size: a.volume_size,
            osd_cpu: a.osd_cpu.clone(),
            client_cpu: a.client_cpu,
            reactors: a.reactors,
            osds: a.osds,
            size: a.size,
            cpu_policy: a.cpu_policy.to_string(),
            store: a.store.clone(),
            fsync: !a.no_fsync,
            dsync: a.dsync,
            idle_poll_us: a.idle_poll_us,
            osd_idle_poll_us: Vec::new(),
            journal_writes: a.journal_writes,
            object_cache: a.object_cache,
            metadata_cache: a.metadata_cache,
            cleaner_rate: a.cleaner_rate,
            latency_target_ms: a.latency_target_ms,
            rows,
            timeline: Vec::new(),
            command: std::env::args().collect(),
            fio_version: (a.target != crate::Target::Carmine)
                .then(crate::fio::version)
                .flatten(),
            mix: a.mix(),
            volumes: a.volumes,
            jobs_per_volume: a.jobs_per_volume,
            verify: a.verify,
            ceph: None,
        }
    }
}

/// Who served the I/O, in words.
/// Who polled before sleeping, as the OSDs said and the client was told.
fn idle_poll_note(run: &Run) -> String {
    let osds: std::collections::BTreeSet<u64> =
        run.osd_idle_poll_us.iter().map(|(_, us)| *us).collect();
    let osd = match (osds.len(), osds.first()) {
        (0, _) => "OSD idle poll not known".to_string(),
        (1, Some(0)) => "OSDs do not poll when idle".to_string(),
        (1, Some(us)) => format!("OSD reactors poll {us} µs before sleeping"),
        _ => {
            let each: Vec<String> = run
                .osd_idle_poll_us
                .iter()
                .map(|(id, us)| format!("osd.{id} {us} µs"))
                .collect();
            format!("OSD idle polls {}", each.join(", "))
        }
    };
    let client = match run.idle_poll_us {
        Some(us) if us > 0 && run.target == crate::Target::Carmine => {
            format!(", the client {us} µs")
        }
        _ => String::new(),
    };
    format!(", {osd}{client}")
}

fn system(run: &Run) -> String {
    if let Some(c) = &run.ceph {
        return match (c.osds, c.size) {
            (Some(osds), Some(size)) if c.throwaway => format!(
                "Ceph ({}), {osds} classic OSD(s) with {} on cpu {}, tcmalloc {}, librbd cache \
                 off (writes acknowledged once durable, as Carmine's), throw-away single-node \
                 cluster (bench/ceph/vstart-ceph.sh), pool size {size} (min_size {})",
                c.version,
                c.store,
                run.osd_cpu,
                if c.tcmalloc == Some(true) {
                    "preloaded"
                } else {
                    "not preloaded"
                },
                size - size / 2
            ),
            _ => format!(
                "Ceph ({}), classic OSDs with {}, an existing cluster",
                c.version, c.store
            ),
        };
    }
    let mut idle_poll = idle_poll_note(run);
    if let Some(n) = run.journal_writes {
        idle_poll += &format!(", {n} journal writes in flight per shard");
    }
    let size = |n: u64| match n >= 1 << 20 {
        true => format!("{} MiB", n >> 20),
        false => format!("{n} bytes"),
    };
    if let Some(n) = run.object_cache {
        idle_poll += &format!(", {} object cache per shard", size(n));
    }
    if let Some(n) = run.metadata_cache {
        idle_poll += &format!(", {} metadata cache per shard", size(n));
    }
    match run.cleaner_rate {
        Some(0) => idle_poll += ", cleaner not paced",
        Some(n) => idle_poll += &format!(", cleaner paced at {} MiB/s", n >> 20),
        None => {}
    }
    format!(
        "Carmine, {} OSD(s) x {} reactor(s), {} on cpu {} (cpu policy {}), {} store{idle_poll}",
        run.osds,
        run.reactors,
        match run.size {
            1 => "1 copy".to_string(),
            n => format!("{n} copies (min {})", n - n / 2),
        },
        run.osd_cpu,
        run.cpu_policy,
        match (run.store.as_str(), run.fsync) {
            ("native", true) if run.dsync => "native (O_DSYNC journal writes)",
            ("native", true) => "native (fdatasync per group commit)",
            ("native", false) => "native (no fdatasync: process-crash durability)",
            ("", _) => "memory",
            (other, _) => other,
        }
    )
}

pub fn markdown(run: &Run) -> String {
    let m = &run.machine;
    let mut s = format!(
        "# carmine bench\n\nmachine: {} ({} cpus, {}, kernel {}, {} GiB)  \n\
         load: {}; client pinned to cpu {}  \n\
         system: {}  \n\
         shape: {} volume(s) of {} MiB, prefilled{}; {} job(s) per volume, qd is per job; \
         random I/O {}{}  \n\
         steps: {} s measured after {} s ramp  \n\
         command: `{}`\n\n",
        m.hostname,
        m.cpus,
        m.cpu_model,
        m.kernel,
        m.memory_gib,
        match run.target {
            crate::Target::Carmine => "built-in load generator through the Carmine client".into(),
            crate::Target::FioNbd => format!(
                "{} (nbd engine) through `carmine nbd serve`, both on the client cpu",
                run.fio_version.as_deref().unwrap_or("fio")
            ),
            crate::Target::FioCarmine => format!(
                "{} with fio-carmine (libcarmine inside fio, no gateway), on the client cpu",
                run.fio_version.as_deref().unwrap_or("fio")
            ),
            crate::Target::FioRbd => format!(
                "{} (rbd engine, librbd)",
                run.fio_version.as_deref().unwrap_or("fio")
            ),
        },
        run.client_cpu,
        system(run),
        run.volumes,
        run.volume_size >> 20,
        if run.verify {
            ", every read verified against the last acknowledged write"
        } else {
            ""
        },
        run.jobs_per_volume,
        run.mix.distribution,
        if run
            .rows
            .iter()
            .any(|r| r.workload == crate::workload::Workload::Randrw)
        {
            format!(", randrw {}% reads", run.mix.read_pct)
        } else {
            String::new()
        },
        run.step_secs,
        run.ramp_secs,
        run.command.join(" ")
    );
    s.push_str("| workload | bs | qd | IOPS | MiB/s | total_ios | mean us | stdev us | p50 us | p99 us | p99.9 us | usr_cpu | sys_cpu | OSD cpu | OSD us/IO | OSD MiB | busiest reactor / thread | reactor busy (own) | ceiling IOPS | % of ceiling | ceiling mean us | latency / ceiling | disk MiB read | disk MiB written | write amp | errors |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &run.rows {
        let c = &r.carmine;
        let (ci, pct, cl, lr) = match &r.ceiling {
            Some(x) => (
                format!("{:.0}", x.iops),
                format!("{:.0}%", 100.0 * c.iops / x.iops.max(1e-9)),
                format!("{:.1}", x.lat_mean_us),
                format!("{:.2}x", c.lat_mean_us / x.lat_mean_us.max(1e-9)),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let u = &r.usage;
        // Carmine's reactors are named osd<id>-r<n>; for Ceph, its busiest thread.
        let busiest = u
            .osd_threads
            .iter()
            .find(|t| t.name.contains("-r"))
            .or(u.osd_threads.first())
            .map_or("-".to_string(), |t| format!("{} {:.0}%", t.name, t.cpu_pct));
        let own = r
            .reactor_busy
            .iter()
            .max_by(|a, b| a.busy_pct.total_cmp(&b.busy_pct))
            .map_or("-".to_string(), |b| {
                let polled = if b.polled_pct > 0.05 {
                    format!(", polling {:.0}%", b.polled_pct)
                } else {
                    String::new()
                };
                format!(
                    "{} {:.0}% (tasks {:.0}%){polled}, {:.0}k wake/s",
                    b.name,
                    b.busy_pct,
                    b.tasks_pct,
                    b.wakeups_per_s / 1e3
                )
            });
        // OSD CPU per I/O, and of it the reactors' idle-poll turns that found no work.
        let polled_cores: f64 = r.reactor_busy.iter().map(|b| b.polled_pct / 100.0).sum();
        let per_io = if polled_cores > 0.0005 && c.iops > 0.0 {
            format!(
                "{:.1} (polling {:.1})",
                r.osd_cpu_us_per_io,
                polled_cores * 1e6 / c.iops
            )
        } else {
            format!("{:.1}", r.osd_cpu_us_per_io)
        };
        // Device bytes written per byte the client wrote, over the same window.
        let write_share = match r.workload {
            crate::workload::Workload::Randrw => 1.0 - run.mix.read_pct as f64 / 100.0,
            wl if wl.is_write() => 1.0,
            _ => 0.0,
        };
        let user_bytes = c.iops * r.bs as f64 * u.wall_secs * write_share;
        let wa = if user_bytes > 0.0 && u.disk_written_bytes > 0 {
            format!("{:.2}", u.disk_written_bytes as f64 / user_bytes)
        } else {
            "-".into()
        };
        s.push_str(&format!(
            "| {} | {}K | {} | {:.0} | {:.1} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0}% | {:.0}% | {:.0}% | {} | {:.0} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} | {} |\n",
            r.workload.name(), r.bs >> 10, r.depth, c.iops, c.mib_s, c.ios, c.lat_mean_us, c.lat_stdev_us, c.lat_p50_us,
            c.lat_p99_us, c.lat_p999_us, u.client_usr_pct, u.client_sys_pct, r.osd_cpu_cores * 100.0,
            per_io, u.osd_rss_mib, busiest, own, ci, pct, cl, lr,
            u.disk_read_bytes as f64 / 1048576.0, u.disk_written_bytes as f64 / 1048576.0, wa,
            if c.verify_errors > 0 { format!("{} + {} WRONG DATA", c.errors, c.verify_errors) } else { c.errors.to_string() }
        ));
    }
    let mixed: Vec<&Row> = run
        .rows
        .iter()
        .filter(|r| r.carmine.reads.is_some() && r.carmine.writes.is_some())
        .collect();
    if !mixed.is_empty() {
        s.push_str(
            "\nMixed workloads, reads and writes apart:\n\n| workload | bs | qd | side | IOPS | mean us | p50 us | p99 us | p99.9 us |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in mixed {
            for (name, side) in [("read", &r.carmine.reads), ("write", &r.carmine.writes)] {
                let Some(x) = side else { continue };
                s.push_str(&format!(
                    "| {} | {}K | {} | {name} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                    r.workload.name(),
                    r.bs >> 10,
                    r.depth,
                    x.iops,
                    x.lat_mean_us,
                    x.lat_p50_us,
                    x.lat_p99_us,
                    x.lat_p999_us
                ));
            }
        }
    }
    let exits: Vec<&Row> = run.rows.iter().filter(|r| r.early_exit.is_some()).collect();
    if !exits.is_empty() {
        s.push_str("\nEarly exits (`--no-early-exit` runs every depth):\n\n");
        for r in exits {
            let why = r.early_exit.as_deref().unwrap_or_default();
            s.push_str(&format!(
                "- {} stopped after qd {}: {why}\n",
                r.workload.name(),
                r.depth
            ));
        }
    }
    let target_us = run.latency_target_ms * 1000.0;
    s.push_str(&format!(
        "\nLatency target: deepest queue with p99.9 <= {} ms\n\n| workload | qd | IOPS | p99.9 us |\n|---|---|---|---|\n",
        run.latency_target_ms
    ));
    let mut seen = Vec::new();
    for r in &run.rows {
        if seen.contains(&r.workload) {
            continue;
        }
        seen.push(r.workload);
        match crate::heuristics::deepest_within(&run.rows, r.workload, target_us) {
            Some(best) => s.push_str(&format!(
                "| {} | {} | {:.0} | {:.1} |\n",
                best.workload.name(),
                best.depth,
                best.carmine.iops,
                best.carmine.lat_p999_us
            )),
            None => s.push_str(&format!("| {} | none | - | - |\n", r.workload.name())),
        }
    }
    s
}
