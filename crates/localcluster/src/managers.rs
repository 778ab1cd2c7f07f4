//! The managers of a cluster whose map is in etcd: `up` starts them (processes of this
//! binary, `carmine mgr`, working directory = the cluster directory, pid and log there) and
//! `down` stops them. One leads at a time, elected through etcd; the others stand by.

use crate::maps::EtcdSettings;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Managers a new etcd cluster runs: one leads, one stands by to take over.
pub const MANAGERS_DEFAULT: u32 = 2;
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
pub fn ensure(exe: &Path, dir: &Path, e: &EtcdSettings) -> Result<Vec<u32>> {
    let running = live(dir);
    let mut started = Vec::new();
    for i in 0..e.managers {
        if running.iter().any(|(r, _)| *r == i) {
            continue;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("mgr.{i}.log")))?;
        let mut cmd = Command::new(exe);
        cmd.arg("mgr")
            .args(e.osd_args())
            .arg("--name")
            .arg(format!("mgr.{i}"))
            .arg("--lease-ttl")
            .arg(e.lease_ttl_secs.to_string())
            .arg("--down-out-grace")
            .arg(e.down_out_grace_secs.to_string());
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
        // Reaped by whoever outlives it; `down` stops it by pid.
        std::mem::forget(child);
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
