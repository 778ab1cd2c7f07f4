//! CPU topology and reactor placement, after Crimson's `vstart.sh --crimson-balance-cpu`.
//!
//! Only physical cores are used (one hardware thread per core), optionally restricted to an
//! allowed set (`--cpu-set`) so other cores stay free for clients. Policies:
//! - `default`: reactors take the allowed cores in cpu order, OSD 0 first, contiguously;
//! - `osd`: all reactors of an OSD on one NUMA socket, OSD `i` on socket `i % sockets`;
//! - `socket`: each OSD's reactors split evenly over the sockets.
//!
//! On a machine with one socket the three policies give the same placement, and
//! [`Allocation::policies_coincide`] says so, so reports never invent differences.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CpuError {
    #[error("invalid cpu list {input:?}: {reason}")]
    BadList { input: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("unexpected content {content:?} in {path}")]
    BadSysfs { path: PathBuf, content: String },
    #[error("unknown cpu policy {0:?} (expected default, osd or socket)")]
    BadPolicy(String),
    #[error("not enough physical cores: {needed} needed {where_}, {available} available")]
    NotEnoughCores {
        needed: usize,
        available: usize,
        where_: String,
    },
}

/// One logical CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpu {
    pub id: u32,
    pub socket: u32,
    pub node: u32,
    /// Core id, unique only within its socket.
    pub core: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuTopology {
    cpus: Vec<Cpu>,
}

/// Largest CPU id accepted in a cpu list; far above any machine, small enough to stay sane.
const CPU_ID_MAX: u32 = 1 << 16;

/// Parses the kernel's cpulist format: `0-3,8,10-11`. Returns sorted, unique ids.
pub fn parse_cpu_list(s: &str) -> Result<Vec<u32>, CpuError> {
    let bad = |reason: &str| CpuError::BadList {
        input: s.to_string(),
        reason: reason.to_string(),
    };
    let mut out = Vec::new();
    for part in s.trim().split(',').map(str::trim) {
        if part.is_empty() {
            return Err(bad("empty element"));
        }
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: u32 = lo.parse().map_err(|_| bad("not a number"))?;
        let hi: u32 = hi.parse().map_err(|_| bad("not a number"))?;
        if lo > hi || hi > CPU_ID_MAX {
            return Err(bad("range is reversed or too large"));
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The compact cpulist form of `cpus` (sorted first).
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

fn read_trimmed(path: &Path) -> Result<String, CpuError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| CpuError::Read {
            path: path.to_path_buf(),
            source,
        })
}

fn read_u32(path: &Path) -> Result<u32, CpuError> {
    let s = read_trimmed(path)?;
    // Some kernels report -1 for an unknown package id; treat it as socket 0.
    if s == "-1" {
        return Ok(0);
    }
    s.parse().map_err(|_| CpuError::BadSysfs {
        path: path.to_path_buf(),
        content: s,
    })
}

impl CpuTopology {
    /// Reads the running machine's topology from `/sys`.
    pub fn from_sys() -> Result<Self, CpuError> {
        Self::from_sys_root(Path::new("/sys"))
    }

    /// Reads a sysfs tree rooted at `root` (tests build fake ones).
    pub fn from_sys_root(root: &Path) -> Result<Self, CpuError> {
        let cpu_dir = root.join("devices/system/cpu");
        let online = parse_cpu_list(&read_trimmed(&cpu_dir.join("online"))?)?;
        let mut node_of = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(root.join("devices/system/node")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(n) = name
                    .strip_prefix("node")
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let list = read_trimmed(&e.path().join("cpulist"))?;
                if list.is_empty() {
                    continue; // memory-only node
                }
                for c in parse_cpu_list(&list)? {
                    node_of.insert(c, n);
                }
            }
        }
        let mut cpus = Vec::with_capacity(online.len());
        for id in online {
            let topo = cpu_dir.join(format!("cpu{id}/topology"));
            cpus.push(Cpu {
                id,
                socket: read_u32(&topo.join("physical_package_id"))?,
                core: read_u32(&topo.join("core_id"))?,
                node: node_of.get(&id).copied().unwrap_or(0),
            });
        }
        Ok(Self { cpus })
    }

    /// A machine numbered the way Linux numbers most x86 servers: the first thread of every
    /// core (socket 0's cores, then socket 1's, …), then the second threads in the same order.
    pub fn synthetic(sockets: u32, cores_per_socket: u32, threads_per_core: u32) -> Self {
        let mut cpus = Vec::new();
        for t in 0..threads_per_core {
            for s in 0..sockets {
                for c in 0..cores_per_socket {
                    let id = t * sockets * cores_per_socket + s * cores_per_socket + c;
                    cpus.push(Cpu {
                        id,
                        socket: s,
                        node: s,
                        core: c,
                    });
                }
            }
        }
        Self { cpus }
    }

    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    /// Socket ids in order.
    pub fn sockets(&self) -> Vec<u32> {
        let mut s: Vec<u32> = self.cpus.iter().map(|c| c.socket).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// Usable physical cores per socket: for each core with an allowed thread, its lowest
    /// allowed cpu id. Lists are in cpu id order.
    pub fn physical_cores(&self, allowed: Option<&[u32]>) -> BTreeMap<u32, Vec<u32>> {
        let mut by_core: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        for c in self
            .cpus
            .iter()
            .filter(|c| allowed.is_none_or(|a| a.contains(&c.id)))
        {
            let e = by_core.entry((c.socket, c.core)).or_insert(c.id);
            *e = (*e).min(c.id);
        }
        let mut out: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for ((socket, _), cpu) in by_core {
            out.entry(socket).or_default().push(cpu);
        }
        for v in out.values_mut() {
            v.sort_unstable();
        }
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CpuPolicy {
    #[default]
    Default,
    Osd,
    Socket,
}

impl FromStr for CpuPolicy {
    type Err = CpuError;
    fn from_str(s: &str) -> Result<Self, CpuError> {
        match s {
            "default" => Ok(Self::Default),
            "osd" => Ok(Self::Osd),
            "socket" => Ok(Self::Socket),
            other => Err(CpuError::BadPolicy(other.to_string())),
        }
    }
}

impl fmt::Display for CpuPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Default => "default",
            Self::Osd => "osd",
            Self::Socket => "socket",
        })
    }
}

/// Where every reactor of every OSD runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub policy: CpuPolicy,
    per_osd: Vec<Vec<u32>>,
    /// Some cores carry more than one reactor because too few were available.
    pub oversubscribed: bool,
    sockets: usize,
}

impl Allocation {
    /// The cpu of each reactor of OSD number `osd` (its index in the map).
    pub fn cpus(&self, osd: u32) -> &[u32] {
        self.per_osd.get(osd as usize).map_or(&[], |v| v.as_slice())
    }

    /// True when the machine (or the allowed set) has one socket: every policy then places
    /// reactors identically.
    pub fn policies_coincide(&self) -> bool {
        self.sockets <= 1
    }

    /// A grid like the seed blog's figures: one row per socket (wrapped every 28 cores), one
    /// cell per usable physical core showing `osd.reactor`, or `.` when free.
    pub fn grid(&self, topo: &CpuTopology) -> String {
        const CORES_PER_ROW: usize = 28;
        let mut owner: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (o, cpus) in self.per_osd.iter().enumerate() {
            for (r, c) in cpus.iter().enumerate() {
                owner.entry(*c).or_default().push(format!("{o}.{r}"));
            }
        }
        let mut s = format!(
            "cpu policy {}{}\n",
            self.policy,
            if self.oversubscribed {
                " (OVERSUBSCRIBED)"
            } else {
                ""
            }
        );
        if self.policies_coincide() {
            s.push_str(
                "one NUMA socket: the default, osd and socket policies give the same placement\n",
            );
        }
        for (socket, cores) in topo.physical_cores(None) {
            for (i, row) in cores.chunks(CORES_PER_ROW).enumerate() {
                let label = if i == 0 {
                    format!("socket {socket}")
                } else {
                    String::new()
                };
                s.push_str(&format!("{label:>9} |"));
                for c in row {
                    let cell = owner.get(c).map_or(".".to_string(), |v| v.join("+"));
                    s.push_str(&format!(" {cell:>4}"));
                }
                s.push('\n');
                s.push_str(&format!("{:>9} |", "cpu"));
                for c in row {
                    s.push_str(&format!(" {c:>4}"));
                }
                s.push('\n');
            }
        }
        s
    }
}

/// Takes `n` cores from `pool` starting at `*next`, wrapping around only when allowed.
fn take(
    pool: &[u32],
    next: &mut usize,
    n: usize,
    over: bool,
    oversubscribed: &mut bool,
    where_: &str,
) -> Result<Vec<u32>, CpuError> {
    if pool.is_empty() || (*next + n > pool.len() && !over) {
        return Err(CpuError::NotEnoughCores {
            needed: *next + n,
            available: pool.len(),
            where_: where_.to_string(),
        });
    }
    let out = (0..n).map(|i| pool[(*next + i) % pool.len()]).collect();
    if *next + n > pool.len() {
        *oversubscribed = true;
    }
    *next += n;
    Ok(out)
}

/// Places `reactors` reactors for each of `osds` OSDs. With `allow_oversubscribe`, too few
/// cores wrap around (several reactors per core) instead of failing.
pub fn allocate(
    topo: &CpuTopology,
    policy: CpuPolicy,
    allowed: Option<&[u32]>,
    osds: u32,
    reactors: u32,
    allow_oversubscribe: bool,
) -> Result<Allocation, CpuError> {
    let per_socket = topo.physical_cores(allowed);
    let sockets: Vec<u32> = per_socket.keys().copied().collect();
    let all: Vec<u32> = {
        let mut v: Vec<u32> = per_socket.values().flatten().copied().collect();
        v.sort_unstable();
        v
    };
    let r = reactors as usize;
    let over = allow_oversubscribe;
    let mut oversubscribed = false;
    let mut per_osd = Vec::with_capacity(osds as usize);
    let empty = Vec::new();
    match policy {
        CpuPolicy::Default => {
            let mut next = 0;
            for _ in 0..osds {
                per_osd.push(take(
                    &all,
                    &mut next,
                    r,
                    over,
                    &mut oversubscribed,
                    "in the allowed set",
                )?);
            }
        }
        CpuPolicy::Osd => {
            let mut next = vec![0usize; sockets.len().max(1)];
            for o in 0..osds as usize {
                let si = o % sockets.len().max(1);
                let pool = sockets
                    .get(si)
                    .and_then(|s| per_socket.get(s))
                    .unwrap_or(&empty);
                let where_ = format!("on socket {}", sockets.get(si).copied().unwrap_or(0));
                per_osd.push(take(
                    pool,
                    &mut next[si],
                    r,
                    over,
                    &mut oversubscribed,
                    &where_,
                )?);
            }
        }
        CpuPolicy::Socket => {
            let n = sockets.len().max(1);
            let mut next = vec![0usize; n];
            for _ in 0..osds {
                let mut cpus = Vec::with_capacity(r);
                for (si, next_si) in next.iter_mut().enumerate() {
                    let share = r / n + usize::from(si < r % n);
                    let pool = sockets
                        .get(si)
                        .and_then(|s| per_socket.get(s))
                        .unwrap_or(&empty);
                    let where_ = format!("on socket {}", sockets.get(si).copied().unwrap_or(0));
                    cpus.extend(take(
                        pool,
                        next_si,
                        share,
                        over,
                        &mut oversubscribed,
                        &where_,
                    )?);
                }
                per_osd.push(cpus);
            }
        }
    }
    Ok(Allocation {
        policy,
        per_osd,
        oversubscribed,
        sockets: sockets.len(),
    })
}

/// Pins the calling thread to one cpu.
pub fn pin_current_thread(cpu: u32) -> io::Result<()> {
    if cpu as usize >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} is out of range"),
        ));
    }
    // SAFETY: cpu_set_t is plain data, zeroed is its empty value; the index is in range.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The cpus the calling thread may run on.
pub fn current_thread_affinity() -> io::Result<Vec<u32>> {
    // SAFETY: as above; sched_getaffinity fills the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|c| libc::CPU_ISSET(*c, &set))
            .map(|c| c as u32)
            .collect())
    }
}

#[cfg(test)]
mod tests;
