//! A vstart-like local cluster: OSD processes whose pids, endpoints, map and logs live under
//! one directory. Used by `carmine cluster`, `carmine demo` and `carmine bench`.
//!
//! OSDs are started as `<carmine binary> osd …`, by default the running executable; set
//! `exe` in [`UpArgs`] to start another binary (tests do).

use anyhow::{bail, Context, Result};
use carmine_client::{Client, ClientConfig};
use carmine_cluster::{OsdInfo, OsdMap, Pool};
use carmine_proto::{Request, Response};
use carmine_reactor::cpu::{allocate, parse_cpu_list, Allocation, CpuPolicy, CpuTopology};
use clap::Args;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const DIR_ENV: &str = "CARMINE_DIR";
pub const DIR_DEFAULT: &str = "carmine-cluster";
const MAP_FILE: &str = "osdmap";
/// How long `up` waits for every reactor to answer a ping.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `down` waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args, Debug, Clone)]
pub struct DirArg {
    /// Cluster directory (map, pids, logs).
    #[arg(long, env = DIR_ENV, default_value = DIR_DEFAULT)]
    pub dir: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Number of OSD processes.
    #[arg(long, default_value_t = 1)]
    pub osds: u32,
    /// Reactors (pinned threads, each with its own store shard) per OSD.
    #[arg(long, default_value_t = 1)]
    pub reactors: u32,
    /// Object store backend: memory, or native (one backing file per OSD in the cluster
    /// directory, kept across `down`/`up`).
    #[arg(long, default_value = "memory")]
    pub store: String,
    /// Native store: size of each OSD's backing file when it is created (sparse).
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub device_size: u64,
    /// Native store: acknowledge after O_DIRECT completion only (no fdatasync): survives a
    /// process crash, not power loss.
    #[arg(long)]
    pub no_fsync: bool,
    /// Memory budget per reactor shard.
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    pub memory_limit: u64,
    /// The carmine binary to start OSDs with (default: this program).
    #[arg(long, hide = true)]
    pub exe: Option<PathBuf>,
    /// Reactor placement policy: default, osd or socket.
    #[arg(long, default_value = "default")]
    pub cpu_policy: CpuPolicy,
    /// Cores the OSDs may use (e.g. "1"); the rest stay free for clients.
    #[arg(long)]
    pub cpu_set: Option<String>,
    /// Do not pin reactors.
    #[arg(long)]
    pub no_pin: bool,
    /// Name of the pool created with the cluster.
    #[arg(long, default_value = "rbd")]
    pub pool: String,
    /// Placement groups in that pool.
    #[arg(long, default_value_t = 64)]
    pub pg_num: u32,
    /// Address the OSDs listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
}

fn pid_file(dir: &Path, osd: u32) -> PathBuf {
    dir.join(format!("osd.{osd}.pid"))
}

pub fn map_path(dir: &Path) -> PathBuf {
    dir.join(MAP_FILE)
}

pub fn read_map(dir: &Path) -> Result<OsdMap> {
    let path = map_path(dir);
    let raw = std::fs::read(&path).with_context(|| {
        format!(
            "reading {} (is a cluster up in {}?)",
            path.display(),
            dir.display()
        )
    })?;
    Ok(OsdMap::decode(raw.into())?)
}

/// Connects a client using the map in `dir` for bootstrap addresses.
pub async fn connect(dir: &Path) -> Result<Client> {
    connect_with(dir, ClientConfig::default()).await
}

/// [`connect`] with a client configuration (e.g. a retry timeout).
pub async fn connect_with(dir: &Path, cfg: ClientConfig) -> Result<Client> {
    let map = read_map(dir)?;
    let addrs: Vec<SocketAddr> = map
        .osds
        .iter()
        .flat_map(|o| o.reactors.iter().copied())
        .collect();
    Client::connect(&addrs, cfg)
        .await
        .context("connecting to the cluster")
}

/// Picks free ports by binding port 0. Another process could take one before the OSD binds
/// it; the OSD then fails to start with a clear error and `up` reports it.
fn free_addrs(host: std::net::IpAddr, n: usize) -> Result<Vec<SocketAddr>> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind((host, 0)))
        .collect::<std::io::Result<_>>()
        .context("finding free ports")?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<std::io::Result<_>>()?)
}

/// Pids recorded in `dir` whose processes are still our OSDs.
fn live_osds(dir: &Path) -> Result<Vec<(u32, i32)>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("osd.")
            .and_then(|s| s.strip_suffix(".pid"))
        else {
            continue;
        };
        let Ok(id) = id.parse::<u32>() else { continue };
        let pid: i32 = std::fs::read_to_string(e.path())?
            .trim()
            .parse()
            .context("bad pid file")?;
        if is_our_osd(pid, dir) {
            out.push((id, pid));
        }
    }
    out.sort();
    Ok(out)
}

/// True if `pid` is alive and is a `carmine osd` using this directory's map, so a recycled
/// pid is never signalled.
fn is_our_osd(pid: i32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let map = map_path(dir);
    let map = std::fs::canonicalize(&map).unwrap_or(map);
    args.iter().any(|a| *a == b"osd")
        && args
            .iter()
            .any(|a| Path::new(std::str::from_utf8(a).unwrap_or("")) == map)
        && !is_zombie(pid)
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// The cluster that `up` started.
pub struct Running {
    pub dir: PathBuf,
    pub map: OsdMap,
    /// The OSD processes, in id order, when this process started them.
    children: Vec<std::process::Child>,
}

impl Running {
    /// Stops the cluster and reaps the OSD processes this process started.
    pub fn down(mut self) -> Result<()> {
        down(&self.dir)?;
        for c in &mut self.children {
            let _ = c.wait();
        }
        Ok(())
    }
}

/// The perf socket of OSD `id` (reactor busy/idle counters).
pub fn perf_socket_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("osd.{id}.perf"))
}

/// The native store's backing file of OSD `id`.
pub fn store_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("osd.{id}.store"))
}

pub fn up(a: &UpArgs) -> Result<Running> {
    if a.store != "memory" && a.store != "native" {
        bail!(
            "unknown store {:?}: this build supports `memory` and `native`",
            a.store
        );
    }
    if a.osds == 0 || a.reactors == 0 {
        bail!("--osds and --reactors must be at least 1");
    }
    let dir = &a.dir.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = std::fs::canonicalize(dir)?;
    let live = live_osds(&dir)?;
    if !live.is_empty() {
        bail!(
            "a cluster is already running in {} ({} OSDs); run `carmine cluster down` first",
            dir.display(),
            live.len()
        );
    }
    let addrs = free_addrs(a.host, (a.osds * a.reactors) as usize)?;
    let map = OsdMap {
        epoch: 1,
        osds: (0..a.osds)
            .map(|id| OsdInfo {
                id,
                up: true,
                reactors: addrs[(id * a.reactors) as usize..((id + 1) * a.reactors) as usize]
                    .to_vec(),
            })
            .collect(),
        pools: vec![Pool {
            id: 1,
            name: a.pool.clone(),
            pg_num: a.pg_num,
            size: 1,
        }],
    };
    map.validate()?;
    std::fs::write(map_path(&dir), map.encode())?;
    let mut children = Vec::with_capacity(a.osds as usize);
    let exe = match &a.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe().context("locating the carmine binary")?,
    };
    for id in 0..a.osds {
        let log = std::fs::File::create(dir.join(format!("osd.{id}.log")))?;
        let mut cmd = Command::new(&exe);
        cmd.arg("osd")
            .arg("--id")
            .arg(id.to_string())
            .arg("--map")
            .arg(map_path(&dir))
            .arg("--perf-socket")
            .arg(perf_socket_path(&dir, id));
        if a.store == "native" {
            cmd.arg("--store")
                .arg("native")
                .arg("--device")
                .arg(store_path(&dir, id))
                .arg("--mkfs")
                .arg("--device-size")
                .arg(a.device_size.to_string());
            if a.no_fsync {
                cmd.arg("--durability").arg("process-crash");
            }
        }
        cmd.arg("--memory-limit")
            .arg(a.memory_limit.to_string())
            .arg("--cpu-policy")
            .arg(a.cpu_policy.to_string());
        if let Some(s) = &a.cpu_set {
            cmd.arg("--cpu-set").arg(s);
        }
        if a.no_pin {
            cmd.arg("--no-pin");
        }
        // Own process group: a Ctrl-C aimed at the shell does not take the cluster down.
        use std::os::unix::process::CommandExt;
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd.spawn().with_context(|| format!("starting osd.{id}"))?;
        std::fs::write(pid_file(&dir, id), child.id().to_string())?;
        children.push(child);
    }
    let mut running = Running {
        dir: dir.clone(),
        map,
        children,
    };
    if let Err(e) = wait_ready(&mut running) {
        let _ = running.down();
        return Err(e);
    }
    println!(
        "cluster up in {}: {} OSD(s) x {} reactor(s), pool {:?} with {} PGs",
        dir.display(),
        a.osds,
        a.reactors,
        a.pool,
        a.pg_num
    );
    for o in &running.map.osds {
        let eps: Vec<String> = o.reactors.iter().map(|r| r.to_string()).collect();
        println!("  osd.{}: {}", o.id, eps.join(" "));
    }
    if !a.no_pin {
        let (topo, alloc) = placement(&running.map, a.cpu_set.as_deref(), a.cpu_policy)?;
        print!("{}", alloc.grid(&topo));
    }
    Ok(running)
}

/// Waits until every reactor answers a ping, or reports the first OSD that died with its log.
fn wait_ready(r: &mut Running) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let endpoints: Vec<(u32, SocketAddr)> = r
        .map
        .osds
        .iter()
        .flat_map(|o| o.reactors.iter().map(move |a| (o.id, *a)))
        .collect();
    for (osd, addr) in endpoints {
        loop {
            if ping(addr).is_ok() {
                break;
            }
            // The child handle, not /proc: right after fork the child still shows our cmdline.
            let exited = r.children[osd as usize].try_wait()?.is_some();
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(r.dir.join(format!("osd.{osd}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                bail!(
                    "osd.{osd} did not come up on {addr}; its log ends with:\n{}",
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

pub fn ping(addr: SocketAddr) -> Result<Duration> {
    carmine_reactor::block_on(async move {
        let conn = carmine_client::Connection::open(addr, 1).await?;
        let t = Instant::now();
        let resp = conn
            .call(&Request::Ping {
                payload: bytes::Bytes::new(),
            })
            .await?;
        conn.close();
        match resp {
            Response::Pong { .. } => Ok(t.elapsed()),
            _ => bail!("unexpected reply to ping"),
        }
    })
}

pub fn down(dir: &Path) -> Result<()> {
    let dir = std::fs::canonicalize(dir)
        .with_context(|| format!("no cluster directory {}", dir.display()))?;
    let live = live_osds(&dir)?;
    for (_, pid) in &live {
        // SAFETY: plain syscall; the pid was just checked to be one of our OSDs.
        unsafe { libc::kill(*pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    let mut killed = 0;
    for (id, pid) in &live {
        while is_our_osd(*pid, &dir) {
            if Instant::now() > deadline {
                eprintln!(
                    "osd.{id} (pid {pid}) ignored SIGTERM for {STOP_TIMEOUT:?}; sending SIGKILL"
                );
                // SAFETY: as above.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
                killed += 1;
                std::thread::sleep(Duration::from_millis(100));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for e in std::fs::read_dir(&dir)?.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("osd.") && n.ends_with(".pid") {
            std::fs::remove_file(e.path())?;
        }
    }
    println!(
        "cluster down in {}: stopped {} OSD(s){}",
        dir.display(),
        live.len(),
        if killed > 0 {
            format!(", {killed} killed")
        } else {
            String::new()
        }
    );
    Ok(())
}

pub fn status(dir: &Path) -> Result<()> {
    let dir = std::fs::canonicalize(dir)
        .with_context(|| format!("no cluster directory {}", dir.display()))?;
    let map = read_map(&dir)?;
    let live = live_osds(&dir)?;
    println!("cluster {}  map epoch {}", dir.display(), map.epoch);
    for p in &map.pools {
        println!(
            "  pool {} {:?}: pg_num {}, size {}",
            p.id, p.name, p.pg_num, p.size
        );
    }
    let mut healthy = true;
    for o in &map.osds {
        let pid = live.iter().find(|(id, _)| *id == o.id).map(|(_, p)| *p);
        println!(
            "  osd.{}: {}",
            o.id,
            pid.map_or("NOT RUNNING".to_string(), |p| format!("running, pid {p}"))
        );
        for (r, addr) in o.reactors.iter().enumerate() {
            let pgs = map.pgs_of_reactor(o.id, r as u32).len();
            match ping(*addr) {
                Ok(rtt) => println!(
                    "    reactor {r} {addr}: up, {pgs} PGs, ping {} us",
                    rtt.as_micros()
                ),
                Err(e) => {
                    healthy = false;
                    println!("    reactor {r} {addr}: DOWN ({e:#})");
                }
            }
        }
    }
    if !healthy {
        bail!("some reactors do not answer");
    }
    Ok(())
}

/// Parses sizes like `4096`, `64K`, `256M`, `4G`, `1T` (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let unit = s[i..]
                .trim_end_matches(['B', 'b', 'i'])
                .to_ascii_uppercase();
            let mult = match unit.as_str() {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use K, M, G or T)")),
            };
            (&s[..i], mult)
        }
    };
    let n: u64 = digits.parse().map_err(|_| format!("invalid size {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Pids of the OSD processes running in `dir`, in OSD id order.
pub fn osd_pids(dir: &Path) -> Result<Vec<i32>> {
    Ok(live_osds(dir)?.into_iter().map(|(_, pid)| pid).collect())
}

/// Where the reactors of every OSD in `map` go on this machine under `policy`, restricted to
/// `cpu_set`. Too few cores oversubscribe (with a note in the grid) rather than fail, so a
/// laptop can still run a multi-OSD cluster.
pub fn placement(
    map: &OsdMap,
    cpu_set: Option<&str>,
    policy: CpuPolicy,
) -> Result<(CpuTopology, Allocation)> {
    let topo = CpuTopology::from_sys().context("reading CPU topology from /sys")?;
    let allowed = cpu_set
        .map(parse_cpu_list)
        .transpose()
        .context("parsing --cpu-set")?;
    let reactors = map.osds.iter().map(|o| o.reactors.len()).max().unwrap_or(0) as u32;
    let osds = map.osds.len() as u32;
    let alloc = allocate(&topo, policy, allowed.as_deref(), osds, reactors, true)
        .with_context(|| format!("placing {osds} OSDs x {reactors} reactors"))?;
    Ok((topo, alloc))
}
