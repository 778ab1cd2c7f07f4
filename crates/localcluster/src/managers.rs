//! The managers of a cluster: `up` starts them (processes of this binary, `carmine mgr`,
//! working directory = the cluster directory, pid and log there) and `down` stops them. One
//! leads at a time (elected through etcd, or by a lock in the directory when the map is a
//! file); the others stand by.

use crate::maps::{self, EtcdSettings};
use crate::{ClusterFile, Running, READY_TIMEOUT};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The managers of a cluster whose map is the file `osdmap`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct LocalManagers {
    pub count: u32,
    pub down_out_grace_secs: u64,
}

impl Default for LocalManagers {
    fn default() -> Self {
        LocalManagers {
            count: MANAGERS_DEFAULT,
            down_out_grace_secs: maps::grace_default(),
        }
    }
}

impl LocalManagers {
    pub fn with_flags(&self, a: &crate::UpArgs) -> Self {
        LocalManagers {
            count: a.managers.unwrap_or(self.count),
            down_out_grace_secs: a.down_out_grace.unwrap_or(self.down_out_grace_secs),
        }
    }
}

/// How a cluster runs its managers: how many, with which rules, and the flags that tell
/// them where the cluster is.
pub(crate) struct Plan {
    pub count: u32,
    lease_ttl_secs: u64,
    down_out_grace_secs: u64,
    report_hold_secs: u64,
    backend: Vec<String>,
}

impl Plan {
    /// The managers the settings of the cluster in `dir` ask for, if any.
    pub fn of(dir: &Path, f: &ClusterFile) -> Option<Plan> {
        match (&f.etcd, &f.local_managers) {
            (Some(e), _) => Some(Plan {
                count: e.managers,
                lease_ttl_secs: e.lease_ttl_secs,
                down_out_grace_secs: e.down_out_grace_secs,
                report_hold_secs: f.failure.report_hold_secs,
                backend: e.osd_args(),
            }),
            (None, Some(m)) => Some(Plan {
                count: m.count,
                lease_ttl_secs: maps::lease_ttl_default(),
                down_out_grace_secs: m.down_out_grace_secs,
                report_hold_secs: f.failure.report_hold_secs,
                backend: vec!["--map".into(), crate::map_path(dir).display().to_string()],
            }),
            (None, None) => None,
        }
    }
}

/// The leading manager's name, if one leads.
pub(crate) fn leader(dir: &Path, etcd: Option<&EtcdSettings>) -> Result<Option<String>> {
    Ok(match etcd {
        Some(e) => carmine_mapstore::membership::leader(&e.client()?, &e.cluster)?,
        None => carmine_mapstore::local_membership::local_leader(dir)?,
    })
}

/// The failure reports the cluster's OSDs publish now, by reporter (those of earlier runs
/// beside a map file included: the caller compares them with the registrations).
pub(crate) fn failure_reports(
    dir: &Path,
    etcd: Option<&EtcdSettings>,
) -> Result<std::collections::BTreeMap<u32, carmine_mapstore::failure_reports::FailureReport>> {
    use carmine_mapstore::failure_reports::{etcd_reports, local_reports};
    Ok(match etcd {
        Some(e) => etcd_reports(&e.client()?, &e.cluster)?,
        None => local_reports(dir)?,
    })
}

/// Waits until the OSDs just started are registered, starts the managers that do not run,
/// and waits until the map shows those OSDs up (a restart after a crash finds them marked
/// down). The managers start after the registrations, so they never see a starting OSD as
/// dead.
pub(crate) fn start(
    exe: &Path,
    r: &mut Running,
    started: &[u32],
    plan: &Plan,
    etcd: Option<&EtcdSettings>,
) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let where_ = if etcd.is_some() {
        "in etcd"
    } else {
        "beside the map"
    };
    loop {
        let registered = crate::registrations(&r.dir)?;
        let missing: Vec<String> = started
            .iter()
            .filter(|id| !registered.contains_key(id))
            .map(|id| format!("osd.{id}"))
            .collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not register {where_} within {READY_TIMEOUT:?}; see their logs",
                missing.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let new = ensure(exe, &r.dir, plan)?;
    if !new.is_empty() {
        let names: Vec<String> = new.iter().map(|i| format!("mgr.{i}")).collect();
        let ttl = match etcd {
            Some(_) => format!("lease TTL {} s, ", plan.lease_ttl_secs),
            None => String::new(),
        };
        r.notes.push(format!(
            "started {} ({ttl}down→out grace {} s)",
            names.join(", "),
            plan.down_out_grace_secs
        ));
    }
    if plan.count == 0 {
        return Ok(());
    }
    let store = maps::open(&r.dir, etcd)?;
    loop {
        let map = store.get()?.context("the cluster map vanished")?;
        let down: Vec<String> = map
            .osds
            .iter()
            .filter(|o| started.contains(&o.id) && !o.up)
            .map(|o| format!("osd.{}", o.id))
            .collect();
        // Done once they are up and a manager leads (so `status` right after `up` finds
        // the cluster watched, not "no manager leads").
        if down.is_empty() && leader(&r.dir, etcd)?.is_some() {
            r.map = map;
            return Ok(());
        }
        if Instant::now() > deadline {
            if down.is_empty() {
                bail!("no manager took the lead within {READY_TIMEOUT:?}; see mgr.*.log");
            }
            bail!(
                "the managers did not mark {} up within {READY_TIMEOUT:?}; see mgr.*.log",
                down.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Managers a new cluster runs: one leads, one stands by to take over.
pub const MANAGERS_DEFAULT: u32 = 2;
/// How long `up` waits for a manager it started to be recognisable as one.
const STARTED_WAIT: Duration = Duration::from_secs(2);
/// How long `down` waits for a manager to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

fn pid_file(dir: &Path, i: u32) -> PathBuf {
    dir.join(format!("mgr.{i}.pid"))
}

/// True if `pid` is a live `carmine mgr` running in `dir`, so a recycled pid is never
/// signalled.
fn is_our_manager(pid: i32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
        return false;
    };
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    cmdline.split(|b| *b == 0).nth(1) == Some(b"mgr") && cwd == dir && !crate::is_zombie(pid)
}

/// The managers running for `dir`, as (index, pid).
pub fn live(dir: &Path) -> Vec<(u32, i32)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(i) = name
            .strip_prefix("mgr.")
            .and_then(|s| s.strip_suffix(".pid"))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let pid = std::fs::read_to_string(e.path())
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(pid) = pid.filter(|p| is_our_manager(*p, dir)) {
            out.push((i, pid));
        }
    }
    out.sort();
    out
}

/// Starts the managers of `dir` that do not run; returns their indexes.
pub(crate) fn ensure(exe: &Path, dir: &Path, plan: &Plan) -> Result<Vec<u32>> {
    let running = live(dir);
    let mut started = Vec::new();
    for i in 0..plan.count {
        if running.iter().any(|(r, _)| *r == i) {
            continue;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("mgr.{i}.log")))?;
        let mut cmd = Command::new(exe);
        cmd.arg("mgr")
            .args(&plan.backend)
            .arg("--name")
            .arg(format!("mgr.{i}"))
            .arg("--lease-ttl")
            .arg(plan.lease_ttl_secs.to_string())
            .arg("--down-out-grace")
            .arg(plan.down_out_grace_secs.to_string())
            .arg("--report-hold")
            .arg(format!("{}s", plan.report_hold_secs));
        use std::os::unix::process::CommandExt;
        let child = cmd
            .current_dir(dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting mgr.{i}"))?;
        std::fs::write(pid_file(dir, i), child.id().to_string())?;
        let pid = child.id() as i32;
        // Reaped by whoever outlives it; `down` stops it by pid.
        std::mem::forget(child);
        // Until it has exec'd, the child still looks like this `up`, not a manager: a second
        // `up` right after this one would not see it and start another.
        let deadline = Instant::now() + STARTED_WAIT;
        while !is_our_manager(pid, dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        started.push(i);
    }
    Ok(started)
}

/// Stops the managers of `dir` (they resign, so nothing waits for a lease); returns how many
/// ran.
pub fn stop(dir: &Path) -> Result<usize> {
    let running = live(dir);
    for (_, pid) in &running {
        // SAFETY: plain syscall; the pid was just checked to be one of our managers.
        unsafe { libc::kill(*pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    for (_, pid) in &running {
        while is_our_manager(*pid, dir) {
            if Instant::now() > deadline {
                // SAFETY: as above.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(running.len());
    };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("mgr.") && n.ends_with(".pid") {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(running.len())
}
