//! `--target fio-rbd`: the same sweep against a real Ceph, through fio's rbd engine (librbd).
//! By default a throw-away single-node cluster from Debian's packages — as many OSDs as
//! `--osds`, a pool of `--size` copies, tcmalloc preloaded when installed — brought up by the
//! built-in copy of bench/ceph/vstart-ceph.sh and torn down by pid; or an existing cluster.

use crate::report::{CephInfo, Run};
use crate::{fio, pin_client, procstat, sweep, BenchArgs};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The script, compiled in so `carmine bench` works from any directory.
const VSTART: &str = include_str!("../../../bench/ceph/vstart-ceph.sh");

struct Cluster {
    conf: PathBuf,
    /// The throw-away cluster's directory (None: an existing cluster, left running).
    owned: Option<PathBuf>,
    pool: String,
    image: Option<String>,
    /// Whether the throw-away cluster's OSDs run with tcmalloc preloaded.
    tcmalloc: Option<bool>,
}

fn vstart(args: &[&str]) -> Result<String> {
    let out = Command::new("bash")
        .arg("-c")
        .arg(VSTART)
        .arg("vstart-ceph.sh")
        .args(args)
        .output()
        .context("running bash")?;
    if !out.status.success() {
        bail!(
            "vstart-ceph.sh {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ceph_cmd(tool: &str, conf: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(tool)
        .arg("-c")
        .arg(conf)
        .args(args)
        .output()
        .with_context(|| format!("running {tool} (Debian package ceph-common)"))?;
    if !out.status.success() {
        bail!(
            "{tool} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Cluster {
    fn start(dir: &Path, store: &str, osd_cpu: &str, osds: u32, size: u8) -> Result<Self> {
        for tool in ["ceph-mon", "ceph-osd", "ceph-mgr", "rbd", "fio"] {
            if Command::new(tool).arg("--version").output().is_err() {
                bail!(
                    "{tool} is not installed: apt-get install ceph-mon ceph-osd ceph-mgr \
                     ceph-common fio"
                );
            }
        }
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let d = dir.to_string_lossy().into_owned();
        eprintln!("starting a throw-away Ceph ({store}, {osds} OSDs, size {size}) in {d}");
        let (osds, size) = (osds.to_string(), size.to_string());
        let args = ["up", &d, store, osd_cpu, &osds, &size];
        // One retry: a throw-away cluster occasionally fails to come up (seen once: its OSD
        // refused by the mon at boot); a fresh one with a new fsid and port does.
        let said = match vstart(&args) {
            Ok(said) => said,
            Err(first) => {
                eprintln!("the throw-away Ceph did not come up, retrying once: {first:#}");
                let _ = vstart(&["down", &d]);
                vstart(&args).map_err(|e| {
                    let _ = vstart(&["down", &d]);
                    e.context(format!("first attempt: {first:#}"))
                })?
            }
        };
        Ok(Cluster {
            conf: dir.join("ceph.conf"),
            owned: Some(dir),
            pool: "rbd".into(),
            image: None,
            tcmalloc: Some(said.lines().any(|l| l == "TCMALLOC=yes")),
        })
    }

    fn existing(conf: &Path, pool: &str) -> Self {
        Cluster {
            conf: conf.to_path_buf(),
            owned: None,
            pool: pool.into(),
            image: None,
            tcmalloc: None,
        }
    }

    /// Waits until every placement group is active+clean.
    fn wait_clean(&self, limit: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            let stat = ceph_cmd("ceph", &self.conf, &["pg", "stat"]).unwrap_or_default();
            let settling = ["unknown", "creating", "peering", "activating"];
            if stat.contains("active+clean") && !settling.iter().any(|s| stat.contains(s)) {
                return Ok(());
            }
            if t0.elapsed() > limit {
                bail!("Ceph placement groups not active+clean after {limit:?}: {stat}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn create_image(&mut self, name: &str, size: u64) -> Result<()> {
        let spec = format!("{}/{name}", self.pool);
        let size = format!("{}M", size.div_ceil(1 << 20));
        ceph_cmd("rbd", &self.conf, &["create", "--size", &size, &spec])?;
        self.image = Some(name.into());
        Ok(())
    }

    /// The ceph-osd processes to sample: the throw-away cluster's, or every local one.
    fn osd_pids(&self) -> Vec<i32> {
        if let Some(dir) = &self.owned {
            return (0..)
                .map_while(|id| std::fs::read_to_string(dir.join(format!("osd.{id}.pid"))).ok())
                .filter_map(|p| p.trim().parse().ok())
                .collect();
        }
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let pid: i32 = e.file_name().to_str()?.parse().ok()?;
                let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
                (comm.trim() == "ceph-osd").then_some(pid)
            })
            .collect()
    }

    fn version(&self) -> String {
        ceph_cmd("ceph", &self.conf, &["version"])
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        match &self.owned {
            Some(dir) => match vstart(&["down", &dir.to_string_lossy()]) {
                // The cluster's data (an 8 GiB sparse BlueStore file among it) goes; its
                // configuration and logs stay for diagnosis.
                Ok(_) => remove_data(dir),
                Err(e) => eprintln!("warning: tearing down the throw-away Ceph: {e:#}"),
            },
            None => {
                if let Some(image) = &self.image {
                    let spec = format!("{}/{image}", self.pool);
                    if let Err(e) = ceph_cmd("rbd", &self.conf, &["rm", "--no-progress", &spec]) {
                        eprintln!("warning: removing {spec}: {e:#}");
                    }
                }
            }
        }
    }
}

/// Everything in a stopped throw-away cluster's directory but `ceph.conf` and the logs.
fn remove_data(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "ceph.conf" || name.ends_with(".log") {
            continue;
        }
        let gone = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if let Err(e) = gone {
            eprintln!("warning: removing {}: {e}", path.display());
        }
    }
}

/// The whole fio-rbd run: cluster, image, prefill, sweep, teardown.
pub fn bench(a: &BenchArgs, dir: &Path) -> Result<Run> {
    let mut cluster = match &a.ceph_conf {
        Some(conf) => Cluster::existing(conf, &a.ceph_pool),
        None => Cluster::start(dir, &a.ceph_store, &a.osd_cpu, a.osds, a.size)?,
    };
    cluster.wait_clean(Duration::from_secs(120))?;
    let image = format!("carmine-bench-{}", std::process::id());
    cluster.create_image(&image, a.volume_size)?;
    // After the cluster started, so its daemons did not inherit the client cpu.
    pin_client(a);
    let fio = fio::Fio::rbd(&cluster.conf, &cluster.pool, &image);
    eprintln!("prefilling {image} ({} MiB)", a.volume_size >> 20);
    fio.prefill(a.volume_size)?;
    let osd_pids = cluster.osd_pids();
    if osd_pids.is_empty() {
        eprintln!("warning: no local ceph-osd process found; OSD CPU and memory will read 0");
    }
    let obs = sweep::Observe::start(
        osd_pids,
        Vec::new(),
        cluster.owned.as_deref().and_then(procstat::disk_of),
        None,
    );
    let mut run = carmine_reactor::block_on(sweep::run(a, obs, async |wl, bs, depth| {
        fio.step(a, wl, bs, depth)
    }))?;
    run.ceph = Some(CephInfo {
        store: match &a.ceph_conf {
            Some(_) => "existing cluster".into(),
            None => a.ceph_store.clone(),
        },
        version: cluster.version(),
        throwaway: cluster.owned.is_some(),
        osds: cluster.owned.is_some().then_some(a.osds),
        size: cluster.owned.is_some().then_some(a.size),
        tcmalloc: cluster.tcmalloc,
    });
    Ok(run)
}
