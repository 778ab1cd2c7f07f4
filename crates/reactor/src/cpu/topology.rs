//! The machine's logical cpus, from Linux sysfs or built synthetically for tests and planning.

use super::{list::parse_cpu_list, CpuError};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

/// One logical cpu (hardware thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpu {
    /// The kernel's cpu number, as used by `sched_setaffinity` and `taskset`.
    pub id: u32,
    /// Physical package (socket) id.
    pub socket: u32,
    /// NUMA node id (0 when the kernel has no NUMA information).
    pub node: u32,
    /// Core id as the kernel reports it; unique only within a socket, informational.
    pub core: u32,
    /// True for the lowest-numbered online thread of its physical core: the only thread of
    /// the core that placement hands out, so a reactor never shares its core's execution units.
    pub first_thread: bool,
}

/// The logical cpus of a machine, sorted by id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuTopology {
    cpus: Vec<Cpu>,
}

impl CpuTopology {
    /// Reads the running machine's topology from `/sys`.
    pub fn from_sys() -> Result<Self, CpuError> {
        Self::from_sys_root(Path::new("/sys"))
    }

    /// Reads a sysfs tree rooted at `root` (normally `/sys`; tests build fake trees).
    ///
    /// Reads `devices/system/cpu/online`, then for every online cpu its `topology/`
    /// `physical_package_id`, `core_id` and `thread_siblings_list`, and NUMA nodes from
    /// `devices/system/node/nodeN/cpulist` (all cpus are node 0 if that directory is absent).
    /// SMT siblings come from `thread_siblings_list` rather than from numbering conventions,
    /// because Intel numbers siblings `n` apart while AMD and ARM number them adjacently.
    pub fn from_sys_root(root: &Path) -> Result<Self, CpuError> {
        let cpu_dir = root.join("devices/system/cpu");
        let online = read_list(&cpu_dir.join("online"))?;
        let online_set: BTreeSet<u32> = online.iter().copied().collect();
        let node_of = read_nodes(&root.join("devices/system/node"))?;
        let mut cpus = Vec::with_capacity(online.len());
        for id in online {
            let topo = cpu_dir.join(format!("cpu{id}/topology"));
            cpus.push(Cpu {
                id,
                socket: read_id(&topo.join("physical_package_id"))?,
                core: read_id(&topo.join("core_id"))?,
                node: node_of.get(&id).copied().unwrap_or(0),
                first_thread: is_first_thread(id, &topo, &online_set)?,
            });
        }
        Ok(Self { cpus })
    }

    /// A machine numbered the way Linux numbers most Intel servers: the first thread of every
    /// core (socket 0's cores, then socket 1's, …), then the second threads in the same order,
    /// and so on. NUMA node = socket. Lets tests and `--dry-run` planning model the seed
    /// blog's 2 × 56-core machine on a laptop. Ids that would not fit a `u32` are left out.
    pub fn synthetic(sockets: u32, cores_per_socket: u32, threads_per_core: u32) -> Self {
        let mut cpus = Vec::new();
        let (s_n, c_n) = (u64::from(sockets), u64::from(cores_per_socket));
        for t in 0..threads_per_core {
            for s in 0..sockets {
                for c in 0..cores_per_socket {
                    let id = (u64::from(t) * s_n + u64::from(s)) * c_n + u64::from(c);
                    let Ok(id) = u32::try_from(id) else { continue };
                    cpus.push(Cpu {
                        id,
                        socket: s,
                        node: s,
                        core: c,
                        first_thread: t == 0,
                    });
                }
            }
        }
        Self { cpus }
    }

    /// All logical cpus, sorted by id.
    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    /// The cpu with this id, if online.
    pub fn cpu(&self, id: u32) -> Option<&Cpu> {
        self.cpus
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|i| &self.cpus[i])
    }

    /// Socket ids, ascending.
    pub fn sockets(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self.cpus.iter().map(|c| c.socket).collect();
        set.into_iter().collect()
    }

    /// The cores placement may use, per socket: first threads of physical cores that are in
    /// `allowed` (all of them when `None`), in cpu id order. Sockets with no usable core are
    /// absent, so policies only spread over sockets that can actually take reactors.
    pub fn physical_cores(&self, allowed: Option<&[u32]>) -> BTreeMap<u32, Vec<u32>> {
        let allowed: Option<BTreeSet<u32>> = allowed.map(|a| a.iter().copied().collect());
        let mut out: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for c in self.cpus.iter().filter(|c| c.first_thread) {
            if allowed.as_ref().is_none_or(|a| a.contains(&c.id)) {
                out.entry(c.socket).or_default().push(c.id);
            }
        }
        out
    }
}

/// Reads a file, trimmed, with the path in any error.
fn read_trimmed(path: &Path) -> Result<String, CpuError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| CpuError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads a cpulist file; a malformed list names the file and its content.
fn read_list(path: &Path) -> Result<Vec<u32>, CpuError> {
    let content = read_trimmed(path)?;
    parse_list_in(path, &content)
}

fn parse_list_in(path: &Path, content: &str) -> Result<Vec<u32>, CpuError> {
    parse_cpu_list(content).map_err(|e| CpuError::BadSysfs {
        path: path.to_path_buf(),
        content: content.to_string(),
        reason: match e {
            CpuError::BadList { reason, .. } => reason,
            _ => "not a cpu list",
        },
    })
}

/// Reads a package or core id. The kernel writes -1 when the architecture does not know
/// (some VMs and ARM boards); that is read as 0 so such machines count as one socket.
fn read_id(path: &Path) -> Result<u32, CpuError> {
    let s = read_trimmed(path)?;
    if s == "-1" {
        return Ok(0);
    }
    s.parse().map_err(|_| CpuError::BadSysfs {
        path: path.to_path_buf(),
        content: s,
        reason: "not a non-negative integer",
    })
}

/// Whether `id` is the lowest online thread listed in its `thread_siblings_list`.
fn is_first_thread(id: u32, topo: &Path, online: &BTreeSet<u32>) -> Result<bool, CpuError> {
    let path = topo.join("thread_siblings_list");
    let content = read_trimmed(&path)?;
    let siblings = parse_list_in(&path, &content)?;
    if !siblings.contains(&id) {
        return Err(CpuError::BadSysfs {
            path,
            content,
            reason: "the siblings list does not contain the cpu itself",
        });
    }
    Ok(siblings.iter().find(|s| online.contains(s)) == Some(&id))
}

/// Maps cpu → NUMA node from `node_dir/nodeN/cpulist`. A missing directory (kernel without
/// NUMA support) yields an empty map; memory-only nodes have an empty list and are skipped.
fn read_nodes(node_dir: &Path) -> Result<BTreeMap<u32, u32>, CpuError> {
    let entries = match std::fs::read_dir(node_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => {
            return Err(CpuError::Read {
                path: node_dir.to_path_buf(),
                source,
            })
        }
    };
    let mut node_of = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|source| CpuError::Read {
            path: node_dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        let Some(node) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue; // has_cpu, online, possible, power, …
        };
        let path = entry.path().join("cpulist");
        let content = read_trimmed(&path)?;
        if content.is_empty() {
            continue;
        }
        for cpu in parse_list_in(&path, &content)? {
            node_of.insert(cpu, node);
        }
    }
    Ok(node_of)
}
