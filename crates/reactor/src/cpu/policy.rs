//! Placement of OSD reactors on physical cores under the `default`, `osd` and `socket` policies.

use super::{format_cpu_list, CpuError, CpuTopology};
use std::fmt;
use std::str::FromStr;

/// How reactors are spread over sockets; the names match `--crimson-balance-cpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum CpuPolicy {
    /// Contiguous cores in cpu order, ignoring sockets (Crimson's behaviour without the flag).
    #[default]
    Default,
    /// All reactors of an OSD on one socket (OSD `i` on socket `i % sockets`): an OSD's memory
    /// stays local to its reactors.
    Osd,
    /// Each OSD's reactors split evenly over the sockets: every OSD gets the same share of
    /// each socket's memory bandwidth and caches.
    Socket,
}

impl CpuPolicy {
    /// All policies, in the order reports list them.
    pub const ALL: [CpuPolicy; 3] = [Self::Default, Self::Osd, Self::Socket];
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

/// Where every reactor of every OSD runs: reactor `r` of OSD `o` is pinned to `cpus(o)[r]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The policy that produced this placement.
    pub policy: CpuPolicy,
    /// Some cores carry more than one reactor because too few were available (only possible
    /// when `allocate` was called with `allow_oversubscribe`).
    pub oversubscribed: bool,
    per_osd: Vec<Vec<u32>>,
    reactors_per_osd: u32,
    /// Cores placement could use (first threads within the allowed set), ascending.
    usable: Vec<u32>,
    /// Sockets that have at least one usable core.
    sockets: u32,
}

impl Allocation {
    /// The cpu of each reactor of OSD number `osd` (its index, 0-based); empty if out of range.
    pub fn cpus(&self, osd: u32) -> &[u32] {
        self.per_osd.get(osd as usize).map_or(&[], Vec::as_slice)
    }

    /// Number of OSDs placed.
    pub fn osds(&self) -> u32 {
        u32::try_from(self.per_osd.len()).unwrap_or(u32::MAX)
    }

    /// Reactors per OSD.
    pub fn reactors_per_osd(&self) -> u32 {
        self.reactors_per_osd
    }

    /// How many reactors, of all the OSDs placed, run on `cpu`.
    pub fn reactors_on(&self, cpu: u32) -> usize {
        self.per_osd.iter().flatten().filter(|&&c| c == cpu).count()
    }

    /// `(osd, cpus)` for every OSD, in OSD order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &[u32])> + '_ {
        (0u32..).zip(self.per_osd.iter().map(Vec::as_slice))
    }

    /// The cores placement could choose from (first threads within the allowed set).
    pub fn usable_cores(&self) -> &[u32] {
        &self.usable
    }

    /// Number of sockets with at least one usable core.
    pub fn sockets(&self) -> u32 {
        self.sockets
    }

    /// True when the usable cores sit on one socket: every policy then places reactors
    /// identically, so comparing policies on this machine measures nothing.
    pub fn policies_coincide(&self) -> bool {
        self.sockets <= 1
    }

    /// A line for reports when [`Self::policies_coincide`], so that results from a
    /// single-socket machine are never presented as a policy comparison.
    pub fn policies_coincide_note(&self) -> Option<&'static str> {
        self.policies_coincide().then_some(
            "one NUMA socket: the default, osd and socket policies give the same placement",
        )
    }

    /// A human-readable grid like the seed blog's figures: a header naming the policy, then
    /// per socket a row of cells (`osd.reactor`, `.` free, `-` outside the allowed set) over a
    /// row of cpu ids, one column per physical core, wrapped every 28 cores.
    pub fn grid(&self, topo: &CpuTopology) -> String {
        super::grid::render(self, topo)
    }
}

/// One pool of cores that reactors are taken from in order (a socket, or all usable cores).
struct Pool {
    cores: Vec<u32>,
    /// Where the shortage is, for the error message.
    scope: String,
    /// Reactors the whole request takes from this pool.
    demand: u64,
    /// Next index to hand out (modulo the pool size when oversubscribing).
    next: u64,
}

impl Pool {
    fn take(&mut self, n: u32, out: &mut Vec<u32>) {
        let len = self.cores.len() as u64;
        for _ in 0..n {
            // len > 0: pools with demand are checked non-empty before any take.
            let i = usize::try_from(self.next % len).unwrap_or(0);
            out.push(self.cores[i]);
            self.next += 1;
        }
    }
}

/// Places `reactors_per_osd` reactors for each of `osds` OSDs on the physical cores of
/// `topo` within `allowed` (all cores when `None`), under `policy`.
///
/// Fails with [`CpuError::NotEnoughCores`] (naming what was needed and available, and where)
/// when the cores do not suffice, unless `allow_oversubscribe` is set: then each pool wraps
/// around round-robin and [`Allocation::oversubscribed`] records it, which keeps multi-OSD
/// clusters runnable on a 2-core laptop. Cpus in `allowed` that are not online are an error
/// ([`CpuError::NotOnline`]); SMT siblings in `allowed` are simply not used.
pub fn allocate(
    topo: &CpuTopology,
    policy: CpuPolicy,
    allowed: Option<&[u32]>,
    osds: u32,
    reactors_per_osd: u32,
    allow_oversubscribe: bool,
) -> Result<Allocation, CpuError> {
    check_online(topo, allowed)?;
    let per_socket = topo.physical_cores(allowed);
    let sockets = u32::try_from(per_socket.len()).unwrap_or(u32::MAX);
    let usable: Vec<u32> = {
        let mut v: Vec<u32> = per_socket.values().flatten().copied().collect();
        v.sort_unstable();
        v
    };
    let restricted = if allowed.is_some() {
        " within the allowed cpu set"
    } else {
        ""
    };
    let mut pools: Vec<Pool> = match policy {
        CpuPolicy::Default => vec![pool(usable.clone(), format!("in total{restricted}"))],
        CpuPolicy::Osd | CpuPolicy::Socket => per_socket
            .into_iter()
            .map(|(s, cores)| pool(cores, format!("on socket {s}{restricted}")))
            .collect(),
    };
    if pools.is_empty() {
        // No usable core at all: one empty pool makes the shortage check report it.
        pools.push(pool(Vec::new(), format!("in total{restricted}")));
    }
    let plan = plan(policy, pools.len(), osds, reactors_per_osd);
    for (i, n) in plan.iter().flatten() {
        pools[*i].demand += u64::from(*n);
    }
    let oversubscribed = check_shortage(&pools, allow_oversubscribe)?;
    let per_osd = plan
        .iter()
        .map(|takes| {
            let mut cpus = Vec::with_capacity(reactors_per_osd as usize);
            for (i, n) in takes {
                pools[*i].take(*n, &mut cpus);
            }
            cpus
        })
        .collect();
    Ok(Allocation {
        policy,
        oversubscribed,
        per_osd,
        reactors_per_osd,
        usable,
        sockets,
    })
}

fn pool(cores: Vec<u32>, scope: String) -> Pool {
    Pool {
        cores,
        scope,
        demand: 0,
        next: 0,
    }
}

/// For each OSD, which pools it takes how many cores from, in order. Pools are either the
/// single "all usable cores" pool (`default`) or one per socket in socket order.
fn plan(policy: CpuPolicy, pools: usize, osds: u32, reactors: u32) -> Vec<Vec<(usize, u32)>> {
    let n = pools.max(1);
    (0..osds as usize)
        .map(|o| match policy {
            CpuPolicy::Default => vec![(0, reactors)],
            CpuPolicy::Osd => vec![(o % n, reactors)],
            CpuPolicy::Socket => (0..n)
                .map(|s| (s, socket_share(reactors, n, s)))
                .filter(|(_, k)| *k > 0)
                .collect(),
        })
        .collect()
}

/// Reactors of one OSD on socket index `s` of `n` under the `socket` policy: an even split,
/// the remainder going to the lowest sockets (5 reactors on 2 sockets: 3 + 2).
fn socket_share(reactors: u32, n: usize, s: usize) -> u32 {
    let n = u32::try_from(n).unwrap_or(u32::MAX).max(1);
    let s = u32::try_from(s).unwrap_or(u32::MAX);
    reactors / n + u32::from(s < reactors % n)
}

/// Errors on the first pool whose demand exceeds its cores (always when it has none);
/// otherwise returns whether any pool must wrap around.
fn check_shortage(pools: &[Pool], allow_oversubscribe: bool) -> Result<bool, CpuError> {
    let mut oversubscribed = false;
    for p in pools {
        let len = p.cores.len() as u64;
        if p.demand <= len {
            continue;
        }
        if len == 0 || !allow_oversubscribe {
            return Err(CpuError::NotEnoughCores {
                needed: u32::try_from(p.demand).unwrap_or(u32::MAX),
                available: u32::try_from(len).unwrap_or(u32::MAX),
                scope: p.scope.clone(),
            });
        }
        oversubscribed = true;
    }
    Ok(oversubscribed)
}

/// Rejects an allowed set naming cpus the topology does not have.
fn check_online(topo: &CpuTopology, allowed: Option<&[u32]>) -> Result<(), CpuError> {
    let Some(allowed) = allowed else {
        return Ok(());
    };
    let missing: Vec<u32> = allowed
        .iter()
        .copied()
        .filter(|c| topo.cpu(*c).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let online: Vec<u32> = topo.cpus().iter().map(|c| c.id).collect();
    Err(CpuError::NotOnline {
        cpus: format_cpu_list(&missing),
        online: format_cpu_list(&online),
    })
}
