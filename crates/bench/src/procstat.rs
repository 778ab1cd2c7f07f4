//! CPU and memory of the OSD processes (per thread, so per reactor) and of this client process,
//! from /proc: before and after each step, and as a time series over the whole run (a sampler
//! thread, so the load generator's reactor never reads /proc).

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Per-thread clock ticks of the OSDs and of this process at one instant.
pub struct Snapshot {
    at: Instant,
    /// Sectors read and written on the disk backing the store, from /proc/diskstats.
    disk: Option<(u64, u64)>,
    /// (pid, tid) → (thread name, utime, stime)
    osd_threads: BTreeMap<(i32, i32), (String, u64, u64)>,
    client: (u64, u64),
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ThreadUsage {
    pub pid: i32,
    pub name: String,
    /// Percent of one core over the step.
    pub cpu_pct: f64,
}

/// What the OSDs and the client used between two snapshots.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Usage {
    pub wall_secs: f64,
    pub osd_usr_pct: f64,
    pub osd_sys_pct: f64,
    /// Busiest-first OSD threads (reactors are named `osd<id>-r<n>`).
    pub osd_threads: Vec<ThreadUsage>,
    pub osd_rss_mib: f64,
    /// This process (the load generator), fio when it is the load, and the NBD gateway.
    pub client_usr_pct: f64,
    pub client_sys_pct: f64,
    /// Bytes the disk under the cluster directory read and wrote over the step (all of the
    /// machine's traffic to that disk, which on this box is the store's).
    pub disk_read_bytes: u64,
    pub disk_written_bytes: u64,
}

/// The (major, minor) of the block device holding `path`.
pub fn disk_of(path: &std::path::Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    Some((libc::major(dev), libc::minor(dev)))
}

/// Sectors read and written of one disk, from /proc/diskstats.
fn disk_sectors(disk: (u32, u32)) -> Option<(u64, u64)> {
    let stats = std::fs::read_to_string("/proc/diskstats").ok()?;
    stats.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (maj, min) = (
            f.first()?.parse::<u32>().ok()?,
            f.get(1)?.parse::<u32>().ok()?,
        );
        ((maj, min) == disk).then(|| Some((f.get(5)?.parse().ok()?, f.get(9)?.parse().ok()?)))?
    })
}

/// (utime, stime) and the thread name from a `stat` file's contents.
fn parse_stat(stat: &str) -> Option<(String, u64, u64)> {
    let open = stat.find('(')?;
    let (name, rest) = stat[open + 1..].rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((
        name.to_string(),
        f.get(11)?.parse().ok()?,
        f.get(12)?.parse().ok()?,
    ))
}

/// (pid, ppid, user ticks, system ticks) of one process, its reaped children's included.
fn process_ticks(stat: &str) -> Option<(i32, i32, u64, u64)> {
    let pid = stat.split_whitespace().next()?.parse().ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    // After the name: state, ppid, ..., utime (11), stime, cutime, cstime (14).
    let ppid = f.get(1)?.parse().ok()?;
    Some((pid, ppid, num(11) + num(13), num(12) + num(14)))
}

/// The client side's CPU ticks: this process and every live descendant (fio and its job
/// processes, the NBD gateway) but the OSDs (`servers`, which `cluster up` started as children)
/// and theirs, each with the children it has reaped. The sum stays continuous as processes
/// exit: a reaped child's time moves into its parent's `cutime`.
fn client_ticks(servers: &[i32]) -> (u64, u64) {
    let all: Vec<(i32, i32, u64, u64)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| process_ticks(&s))
        .collect();
    let mut family = vec![std::process::id() as i32];
    let mut i = 0;
    while i < family.len() {
        let parent = family[i];
        family.extend(
            all.iter()
                .filter(|p| p.1 == parent && !servers.contains(&p.0))
                .map(|p| p.0),
        );
        i += 1;
    }
    all.iter()
        .filter(|p| family.contains(&p.0))
        .fold((0, 0), |acc, p| (acc.0 + p.2, acc.1 + p.3))
}

pub fn snapshot(osd_pids: &[i32], disk: Option<(u32, u32)>) -> Snapshot {
    let mut osd_threads = BTreeMap::new();
    for &pid in osd_pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(tid) = t.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if let Some(s) = std::fs::read_to_string(t.path().join("stat"))
                .ok()
                .and_then(|s| parse_stat(&s))
            {
                osd_threads.insert((pid, tid), s);
            }
        }
    }
    let client = client_ticks(osd_pids);
    Snapshot {
        at: Instant::now(),
        disk: disk.and_then(disk_sectors),
        osd_threads,
        client,
    }
}

fn rss_mib(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(str::to_owned)
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The usage between `before` and `after`; RSS is read now.
pub fn usage(before: &Snapshot, after: &Snapshot, osd_pids: &[i32]) -> Usage {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let wall = (after.at - before.at).as_secs_f64().max(1e-9);
    let pct = |ticks: u64| ticks as f64 / hz / wall * 100.0;
    let (mut usr, mut sys) = (0u64, 0u64);
    let mut threads = Vec::new();
    for (key, (name, u1, s1)) in &after.osd_threads {
        let (u0, s0) = before
            .osd_threads
            .get(key)
            .map_or((0, 0), |(_, u, s)| (*u, *s));
        let (du, ds) = (u1.saturating_sub(u0), s1.saturating_sub(s0));
        usr += du;
        sys += ds;
        threads.push(ThreadUsage {
            pid: key.0,
            name: name.clone(),
            cpu_pct: pct(du + ds),
        });
    }
    threads.sort_by(|a, b| b.cpu_pct.total_cmp(&a.cpu_pct));
    threads.truncate(16);
    Usage {
        wall_secs: wall,
        osd_usr_pct: pct(usr),
        osd_sys_pct: pct(sys),
        osd_threads: threads,
        osd_rss_mib: osd_pids.iter().map(|p| rss_mib(*p)).sum(),
        client_usr_pct: pct(after.client.0.saturating_sub(before.client.0)),
        client_sys_pct: pct(after.client.1.saturating_sub(before.client.1)),
        disk_read_bytes: match (before.disk, after.disk) {
            (Some(b), Some(a)) => a.0.saturating_sub(b.0) * 512,
            _ => 0,
        },
        disk_written_bytes: match (before.disk, after.disk) {
            (Some(b), Some(a)) => a.1.saturating_sub(b.1) * 512,
            _ => 0,
        },
    }
}

/// One point of the run's timeline: usage over the interval ending at `t`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    /// Index of the step running then (into the run's rows), if any.
    pub step: Option<usize>,
    pub osd_cpu_pct: f64,
    pub osd_rss_mib: f64,
    pub client_cpu_pct: f64,
    /// Busiest OSD thread's percent of one core.
    pub busiest_thread_pct: f64,
    /// Busiest reactor's busy share by its own loop's account (Carmine OSDs only).
    pub reactor_busy_pct: Option<f64>,
}

/// The reactors' own busy/idle counters, from the OSDs' perf sockets.
#[derive(Clone, Debug, Default)]
pub struct ReactorCounters(Vec<carmine_reactor::perf::ReactorPerf>);

/// One reactor's busy share over a step, as its own loop measured it.
#[derive(Clone, Debug, Serialize)]
pub struct ReactorBusy {
    pub name: String,
    /// On CPU, of the wall time.
    pub busy_pct: f64,
    /// Of which running tasks; the rest is io_uring's completion work in the kernel wait.
    pub tasks_pct: f64,
    /// On CPU polling for work that did not come (`--idle-poll-us`), not in `busy_pct`.
    #[serde(default)]
    pub polled_pct: f64,
    /// Times per second the reactor went to sleep in the kernel and woke.
    pub wakeups_per_s: f64,
}

impl ReactorCounters {
    /// Every socket that answers (an OSD without one is simply not counted).
    pub fn read(sockets: &[std::path::PathBuf]) -> Self {
        ReactorCounters(
            sockets
                .iter()
                .filter_map(|p| carmine_reactor::perf::read_perf_socket(p).ok())
                .flat_map(|d| d.reactors)
                .collect(),
        )
    }

    pub fn busy_since(&self, earlier: &ReactorCounters, secs: f64) -> Vec<ReactorBusy> {
        self.0
            .iter()
            .filter_map(|now| {
                let before = earlier.0.iter().find(|r| r.name == now.name)?;
                let share = now.load.share_since(&before.load);
                Some(ReactorBusy {
                    name: now.name.clone(),
                    busy_pct: share.busy_pct,
                    tasks_pct: share.tasks_pct,
                    polled_pct: share.polled_pct,
                    wakeups_per_s: now.load.sleeps.saturating_sub(before.load.sleeps) as f64
                        / secs.max(1e-9),
                })
            })
            .collect()
    }
}

/// Samples the OSDs and this process every `every` until stopped.
pub struct Sampler {
    started: Instant,
    step: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    join: std::thread::JoinHandle<Vec<Sample>>,
}

const NO_STEP: usize = usize::MAX;

impl Sampler {
    pub fn start(
        osd_pids: Vec<i32>,
        perf_sockets: Vec<std::path::PathBuf>,
        every: Duration,
    ) -> Self {
        let started = Instant::now();
        let step = Arc::new(AtomicUsize::new(NO_STEP));
        let stop = Arc::new(AtomicBool::new(false));
        let (step2, stop2) = (step.clone(), stop.clone());
        let join = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut prev = snapshot(&osd_pids, None);
            let mut prev_reactors = ReactorCounters::read(&perf_sockets);
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(every);
                let now = snapshot(&osd_pids, None);
                let reactors = ReactorCounters::read(&perf_sockets);
                let u = usage(&prev, &now, &osd_pids);
                let busy = reactors.busy_since(&prev_reactors, (now.at - prev.at).as_secs_f64());
                let s = step2.load(Ordering::Relaxed);
                out.push(Sample {
                    t: (now.at - started).as_secs_f64(),
                    step: (s != NO_STEP).then_some(s),
                    osd_cpu_pct: u.osd_usr_pct + u.osd_sys_pct,
                    osd_rss_mib: u.osd_rss_mib,
                    client_cpu_pct: u.client_usr_pct + u.client_sys_pct,
                    busiest_thread_pct: u.osd_threads.first().map_or(0.0, |t| t.cpu_pct),
                    reactor_busy_pct: busy.iter().map(|r| r.busy_pct).reduce(f64::max),
                });
                prev = now;
                prev_reactors = reactors;
            }
            out
        });
        Sampler {
            started,
            step,
            stop,
            join,
        }
    }

    /// Seconds since the sampler started (the run's clock).
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Marks the samples from now on as belonging to step `index` (or to none).
    pub fn set_step(&self, index: Option<usize>) {
        self.step.store(index.unwrap_or(NO_STEP), Ordering::Relaxed);
    }

    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.join.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_thread_names_parse() {
        let line = "123 (osd0-r0 (x)) S 1 2 3 4 5 6 7 8 9 10 250 40 0 0";
        assert_eq!(parse_stat(line), Some(("osd0-r0 (x)".to_string(), 250, 40)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_cpu_is_seen() {
        let before = snapshot(&[std::process::id() as i32], None);
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 200 {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let u = usage(
            &before,
            &snapshot(&[std::process::id() as i32], None),
            &[std::process::id() as i32],
        );
        assert!(u.osd_usr_pct + u.osd_sys_pct > 10.0, "{u:?}");
        assert!(u.osd_rss_mib > 0.0);
    }

    #[test]
    fn a_live_child_counts_as_client_cpu_before_it_exits() {
        let before = client_ticks(&[]);
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 5",
            ])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let during = client_ticks(&[]);
        // A server child (an OSD) is not client CPU.
        let without = client_ticks(&[child.id() as i32]);
        child.kill().unwrap();
        child.wait().unwrap();
        let after = client_ticks(&[]);
        assert!(
            without.0 + without.1 + 10 < during.0 + during.1,
            "{without:?} {during:?}"
        );
        // The child burned CPU and is still alive (sleeping): its ticks already count.
        assert!(
            during.0 + during.1 > before.0 + before.1 + 10,
            "{before:?} {during:?}"
        );
        // Reaping moves them into cutime without losing them.
        assert!(
            after.0 + after.1 >= during.0 + during.1,
            "{during:?} {after:?}"
        );
    }

    #[test]
    fn the_sampler_sees_a_busy_step() {
        let sampler = Sampler::start(
            vec![std::process::id() as i32],
            Vec::new(),
            Duration::from_millis(50),
        );
        sampler.set_step(Some(3));
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 300 {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        sampler.set_step(None);
        std::thread::sleep(Duration::from_millis(120));
        let samples = sampler.finish();
        assert!(samples.len() >= 4, "{samples:?}");
        assert!(samples.windows(2).all(|w| w[0].t < w[1].t));
        let busy: Vec<_> = samples.iter().filter(|s| s.step == Some(3)).collect();
        assert!(!busy.is_empty());
        assert!(busy.iter().any(|s| s.osd_cpu_pct > 50.0), "{busy:?}");
        assert!(samples.last().unwrap().step.is_none());
    }
}
