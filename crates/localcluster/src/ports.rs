//! The OSDs' listening ports: picking free ones, waiting for a dead OSD's to be released, and
//! moving an OSD whose port another process took before it could listen.
//!
//! A port is chosen (or checked) by `up` and bound later by the OSD process, so another
//! process may take it in between: a cluster starting beside this one that picked the same
//! free port, or a private etcd. The map is the only place that says where an OSD listens, so
//! an OSD that lost its port is given new ones in a new epoch and started again, a bounded
//! number of times, instead of failing the whole `up`.

use super::{maps, ping, Running, READY_TIMEOUT};
use anyhow::{bail, Context, Result};
use carmine_mapstore::MapStoreError::Unavailable;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

/// Picks `n` distinct ports that are free now, below the kernel's ephemeral range (32768 and
/// up by default), so that no outgoing connection of another process can be given one of
/// them before the OSD binds it (seen in CI with many clusters starting at once). Another
/// listener could still take one; [`ready_or_moved`] then moves the OSD.
pub(crate) fn free_addrs(host: std::net::IpAddr, n: usize) -> Result<Vec<SocketAddr>> {
    let mut out: Vec<SocketAddr> = Vec::with_capacity(n);
    let mut tries = 0;
    while out.len() < n {
        tries += 1;
        if tries > 64 * n.max(1) {
            bail!("finding {n} free ports on {host}: too many in use below 32000");
        }
        let addr = SocketAddr::new(host, rand::random_range(10_000..32_000));
        if !out.contains(&addr) && TcpListener::bind(addr).is_ok() {
            out.push(addr);
        }
    }
    Ok(out)
}

/// How long a restart waits for a dead OSD's port: a process killed with io_uring
/// operations pending releases its sockets only when the kernel tears the ring down, a
/// moment after the process is gone.
const PORT_RELEASE_WAIT: Duration = Duration::from_secs(5);

pub(crate) fn bindable_soon(addr: SocketAddr) -> bool {
    let deadline = Instant::now() + PORT_RELEASE_WAIT;
    loop {
        if TcpListener::bind(addr).is_ok() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How many times one `up` moves OSDs that lost a port and starts them again. Each loss
/// needs another process to take the very port chosen a moment earlier; more than a few in
/// a row means something else is wrong, which the last OSD log then shows.
const MOVES: u32 = 3;

/// The line `up` writes to an OSD's log before it starts the OSD.
pub(crate) fn run_marker(osd: u32) -> String {
    format!("-- osd.{osd} started by `carmine cluster up` --")
}

/// The last lines of an OSD's log from its latest run started by `up`: an earlier run's end
/// (say, a port it lost then) must not be taken for this one's.
fn run_tail(log: &str, osd: u32) -> Vec<String> {
    let marker = run_marker(osd);
    let mut tail: Vec<String> = log
        .lines()
        .rev()
        .take_while(|l| *l != marker)
        .take(15)
        .map(String::from)
        .collect();
    tail.reverse();
    tail
}

/// An OSD that did not come up.
#[derive(Debug)]
pub(crate) struct NotReady {
    osd: u32,
    addr: SocketAddr,
    exited: bool,
    tail: Vec<String>,
}

impl NotReady {
    /// Whether the OSD exited because another process listened on one of its ports.
    fn lost_port(&self) -> bool {
        self.exited
            && self
                .tail
                .iter()
                .rev()
                .take(3)
                .any(|l| l.contains("cannot listen on") && l.contains("Address already in use"))
    }
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "osd.{} did not come up on {}; its log ends with:\n{}",
            self.osd,
            self.addr,
            self.tail.join("\n")
        )
    }
}

/// Waits until every reactor of `osds` answers a ping, or reports the first OSD that died
/// (or did not answer in time) with the end of its log.
pub(crate) fn wait_ready(r: &mut Running, osds: &[u32]) -> Result<(), NotReady> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let endpoints: Vec<(u32, SocketAddr)> = r
        .map
        .osds
        .iter()
        .filter(|o| osds.contains(&o.id))
        .flat_map(|o| o.reactors.iter().map(move |a| (o.id, *a)))
        .collect();
    for (osd, addr) in endpoints {
        loop {
            if ping(addr, r.key.as_ref()).is_ok() {
                break;
            }
            // The child handle, not /proc: right after fork the child still shows our cmdline.
            let exited = match r.children.iter_mut().find(|(id, _)| *id == osd) {
                Some((_, c)) => !matches!(c.try_wait(), Ok(None)),
                None => false,
            };
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(r.dir.join(format!("osd.{osd}.log")))
                    .unwrap_or_default();
                return Err(NotReady {
                    osd,
                    addr,
                    exited,
                    tail: run_tail(&log, osd),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// [`wait_ready`], moving an OSD that lost a port to new ones and starting it again with
/// `start` (up to [`MOVES`] times).
pub(crate) fn ready_or_moved(
    r: &mut Running,
    osds: &[u32],
    etcd: Option<&maps::EtcdSettings>,
    start: &mut dyn FnMut(u32) -> Result<std::process::Child>,
) -> Result<()> {
    let mut moves = 0;
    loop {
        let lost = match wait_ready(r, osds) {
            Ok(()) => return Ok(()),
            Err(n) if n.lost_port() && moves < MOVES => n,
            Err(n) => bail!("{n}"),
        };
        moves += 1;
        // The exited child stays listed until its successor runs: if the move or the start
        // fails, `up` still counts it among the OSDs that did not come up.
        if let Some((_, old)) = r.children.iter_mut().find(|(id, _)| *id == lost.osd) {
            let _ = old.wait();
        }
        let (map, moved) = move_endpoints(&r.dir, etcd, lost.osd)?;
        r.notes.push(if moved.is_empty() {
            format!(
                "osd.{}: a port was taken for a moment; started it again",
                lost.osd
            )
        } else {
            format!(
                "osd.{}: another process took {} before it could listen; moved to {} (map epoch \
             {})",
                lost.osd,
                moved
                    .iter()
                    .map(|(from, _)| from.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                moved
                    .iter()
                    .map(|(_, to)| to.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                map.epoch
            )
        });
        r.map = map;
        let child = start(lost.osd)?;
        std::fs::write(super::pid_file(&r.dir, lost.osd), child.id().to_string())?;
        match r.children.iter_mut().find(|(id, _)| *id == lost.osd) {
            Some((_, old)) => *old = child,
            None => r.children.push((lost.osd, child)),
        }
    }
}

/// Gives `osd` new ports for the endpoints it cannot bind, in a new epoch of the stored map;
/// the map stored and the endpoints moved (old, new).
fn move_endpoints(
    dir: &Path,
    etcd: Option<&maps::EtcdSettings>,
    osd: u32,
) -> Result<(carmine_cluster::OsdMap, Vec<(SocketAddr, SocketAddr)>)> {
    let store = maps::open(dir, etcd)?;
    // The managers or running OSDs may change the map meanwhile (a failure report): `update`
    // reads, changes and swaps again on a conflict, a bounded number of times.
    let mut moved = Vec::new();
    let stored = carmine_mapstore::update(store.as_ref(), 8, |current| {
        let mut map = current
            .cloned()
            .ok_or_else(|| Unavailable("the cluster map disappeared".into()))?;
        let o = map
            .osds
            .iter_mut()
            .find(|o| o.id == osd)
            .ok_or_else(|| Unavailable(format!("osd.{osd} left the map while it started")))?;
        moved.clear();
        for r in o.reactors.iter_mut() {
            if !bindable_soon(*r) {
                let new = free_addrs(r.ip(), 1).map_err(|e| Unavailable(format!("{e:#}")))?;
                moved.push((*r, new[0]));
                *r = new[0];
            }
        }
        if moved.is_empty() {
            // Taken for a moment only (another process checking that it was free).
            return Ok(None);
        }
        map.epoch += 1;
        Ok(Some(map))
    })
    .context("storing the map with the moved endpoints")?
    .context("the cluster map disappeared while OSDs were starting")?;
    Ok((stored, moved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_lost_by_an_earlier_run_is_not_taken_for_this_ones() {
        let addr: SocketAddr = "127.0.0.1:6800".parse().unwrap();
        let lost = "ERROR cannot listen on 127.0.0.1:6800: Address already in use (os error 98)";
        let earlier = format!("{}\nstarting\n{lost}\n", run_marker(3));
        let not_ready = |log: &str| NotReady {
            osd: 3,
            addr,
            exited: true,
            tail: run_tail(log, 3),
        };
        assert!(not_ready(&earlier).lost_port());
        let now = format!(
            "{earlier}{}\nstarting\nERROR the store is damaged\n",
            run_marker(3)
        );
        let n = not_ready(&now);
        assert!(!n.lost_port(), "{n}");
        assert_eq!(n.tail, vec!["starting", "ERROR the store is damaged"]);
        // A log from before markers: its last lines, as before.
        assert!(not_ready(&format!("x\n{lost}\n")).lost_port());
    }
}
