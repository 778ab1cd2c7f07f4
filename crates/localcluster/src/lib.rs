//! A vstart-like local cluster: OSD processes whose pids, endpoints, map and logs live under
//! one directory. Used by `carmine cluster`, `carmine demo` and `carmine bench`.
//!
//! OSDs are started as `<carmine binary> osd …`, by default the running executable; set
//! `exe` in [`UpArgs`] to start another binary (tests do).

mod histories;
mod managers;
mod maps;
mod ports;
mod run;
mod status;

pub use status::{status, Health, Status};

use anyhow::{bail, Context, Result};
use carmine_client::{Client, ClientConfig};
use carmine_cluster::{OsdInfo, OsdMap, Pool};
use carmine_proto::auth::AuthKey;
use carmine_proto::{Request, Response};
use carmine_reactor::cpu::{allocate, parse_cpu_list, Allocation, CpuPolicy, CpuTopology};
use clap::Args;
pub use histories::{pg_histories, pgs_naming};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const DIR_ENV: &str = "CARMINE_DIR";
pub const DIR_DEFAULT: &str = "carmine-cluster";
const MAP_FILE: &str = "osdmap";
const KEY_FILE: &str = "cluster.key";
/// How long `up` waits for every reactor to answer a ping.
/// A native store file's size when `--device-size` is not given.
const DEVICE_SIZE_DEFAULT: u64 = 4 << 30;
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(20);
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
    /// Number of OSD processes [new cluster: 1]. On an existing cluster it must match.
    #[arg(long)]
    pub osds: Option<u32>,
    /// Reactors (pinned threads, each with its own store shard) per OSD [new cluster: 1].
    #[arg(long)]
    pub reactors: Option<u32>,
    /// Object store backend: memory, or native (one backing file per OSD in the cluster
    /// directory, kept across `down`/`up`) [new cluster: memory].
    #[arg(long)]
    pub store: Option<String>,
    /// Native store: size of each OSD's backing file when it is created [4G].
    #[arg(long, value_parser = parse_size)]
    pub device_size: Option<u64>,
    /// Native store: acknowledge after O_DIRECT completion only (no fdatasync): survives a
    /// process crash, not power loss.
    ///
    /// This flag and the ones below up to --journal-writes are kept with the cluster: a
    /// later `up` restarts its OSDs with them unless given again otherwise.
    #[arg(long, conflicts_with_all = ["dsync", "fsync"])]
    pub no_fsync: bool,
    /// Native store: O_DSYNC journal writes (FUA where the device has it) instead of a
    /// separate fdatasync; still power-loss durable.
    #[arg(long, conflicts_with = "fsync")]
    pub dsync: bool,
    /// Native store: an fdatasync after each journal write (the default; for an `up` that
    /// restarts a cluster made with --no-fsync or --dsync).
    #[arg(long)]
    pub fsync: bool,
    /// Memory budget per reactor shard [2G].
    #[arg(long, value_parser = parse_size)]
    pub memory_limit: Option<u64>,
    /// The carmine binary to start OSDs with (default: this program).
    #[arg(long, hide = true)]
    pub exe: Option<PathBuf>,
    /// Reactor placement policy: default, osd or socket [default].
    #[arg(long)]
    pub cpu_policy: Option<CpuPolicy>,
    /// Cores the OSDs may use (e.g. "1"); the rest stay free for clients [all].
    #[arg(long)]
    pub cpu_set: Option<String>,
    /// Do not pin reactors.
    #[arg(long, conflicts_with = "pin")]
    pub no_pin: bool,
    /// Pin reactors (the default; for an `up` that restarts a cluster made with --no-pin).
    #[arg(long)]
    pub pin: bool,
    /// MiB per second each OSD reactor copies to recover replicated PGs in the background
    /// (the OSDs' own default if not given; 0: no limit).
    #[arg(long)]
    pub recovery_rate_mib: Option<u64>,
    /// The same while clients are active on the reactor (the OSDs' own default if not given;
    /// 0: the rate above).
    #[arg(long)]
    pub recovery_busy_rate_mib: Option<u64>,
    /// Objects each OSD reactor recovers at once, all its PGs together (the OSDs' own default
    /// if not given; 1 to 256).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub recovery_max_active: Option<usize>,
    /// Objects a copy back empty must lack of a PG before the PG is served by its other
    /// copies while it fills (the OSDs' own default if not given).
    #[arg(long)]
    pub backfill_min_objects: Option<usize>,
    /// Microseconds an idle OSD reactor polls before it sleeps. Not given: the OSDs' default
    /// (50 with `--cpu-set` where each reactor has a core of its own, else 0). Kept across
    /// restarts once given; `--reset-osd-settings` returns to the default.
    #[arg(long)]
    pub idle_poll_us: Option<u64>,
    /// Native store: journal writes in flight per shard (the OSDs' default, 1, if not given).
    #[arg(long)]
    pub journal_writes: Option<u32>,
    /// Native store: object bodies kept in memory per shard (the OSDs' default, 64M, if not
    /// given).
    #[arg(long, value_parser = parse_size)]
    pub object_cache: Option<u64>,
    /// Native store: metadata tree nodes kept in memory per shard (the OSDs' default, 64M,
    /// if not given). Kept across restarts once given.
    #[arg(long, value_parser = parse_size)]
    pub metadata_cache: Option<u64>,
    /// Native store: pace the background cleaner to this many bytes per second while
    /// clients use the store (0: no pacing, the OSDs' default; else at least 1M). Kept
    /// across restarts once given.
    #[arg(long, value_parser = parse_cleaner_rate)]
    pub cleaner_rate: Option<u64>,
    /// Restart the OSDs with the defaults for every setting this `up` gives no flag for,
    /// instead of the ones the cluster kept (memory limit, cpu policy and set, pinning,
    /// durability, recovery rates, idle poll, journal writes, object cache, cleaner rate).
    #[arg(long)]
    pub reset_osd_settings: bool,
    /// Name of the pool created with the cluster [rbd].
    #[arg(long)]
    pub pool: Option<String>,
    /// Placement groups in that pool [64].
    #[arg(long)]
    pub pg_num: Option<u32>,
    /// Copies of every object in that pool [new cluster: 3 with 3 OSDs or more, else 1].
    #[arg(long)]
    pub size: Option<u8>,
    /// Copies that must be up for a PG to take requests [new cluster: size - size/2].
    #[arg(long)]
    pub min_size: Option<u8>,
    /// Address the OSDs listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// New cluster: keep the map in this etcd (http://host:port, comma-separated members)
    /// instead of the file `osdmap`.
    #[arg(long, value_delimiter = ',', conflicts_with = "with_etcd")]
    pub etcd: Option<Vec<String>>,
    /// New cluster: keep the map in a private etcd (from PATH) that the cluster directory
    /// holds; `up` starts it, `down` stops it.
    #[arg(long)]
    pub with_etcd: bool,
    #[command(flatten)]
    pub etcd_access: EtcdAccessArgs,
    /// Cluster in etcd: manager processes to run (one leads, the others stand by) [2].
    #[arg(long)]
    pub managers: Option<u32>,
    /// Cluster in etcd: TTL in seconds of the leases that show OSDs and managers alive; a
    /// dead OSD is marked down about this long after it died [5].
    #[arg(long)]
    pub lease_ttl: Option<u64>,
    /// Cluster in etcd: seconds an OSD stays down before it is marked out and its PGs move
    /// [600].
    #[arg(long)]
    pub down_out_grace: Option<u64>,
    /// Seconds a replicated PG waits on an OSD that does not answer before its OSD reports it
    /// to the managers (an OSD that hangs, or a link broken between two OSDs) [10].
    #[arg(long)]
    pub peer_grace: Option<u64>,
    /// Seconds an OSD its peers reported stays down the first time; each further time in a
    /// row twice as long [20].
    #[arg(long)]
    pub report_hold: Option<u64>,
}

/// The shortest `--peer-grace`: two of the OSDs' default read leases.
const PEER_GRACE_MIN_SECS: u64 = 4;

/// How the cluster's OSDs report peers they cannot hear from, and how long the managers hold
/// a reported OSD down (decision 0014).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct FailureDetection {
    pub peer_grace_secs: u64,
    pub report_hold_secs: u64,
}

impl Default for FailureDetection {
    fn default() -> Self {
        FailureDetection {
            peer_grace_secs: 10,
            report_hold_secs: 20,
        }
    }
}

impl FailureDetection {
    fn with_flags(self, a: &UpArgs) -> Self {
        FailureDetection {
            peer_grace_secs: a.peer_grace.unwrap_or(self.peer_grace_secs),
            report_hold_secs: a.report_hold.unwrap_or(self.report_hold_secs),
        }
    }
}

/// The new pool's copies and `min_size`: as asked, or 3 (min 2) once there are 3 OSDs, else
/// one copy; never more copies than OSDs.
fn pool_copies(a: &UpArgs, osds: u32) -> Result<(u8, u8)> {
    let size = a.size.unwrap_or(if osds >= 3 { 3 } else { 1 });
    if size == 0 || size > carmine_cluster::REPLICA_SIZE_MAX {
        bail!(
            "--size {size}: a pool keeps 1 to {} copies",
            carmine_cluster::REPLICA_SIZE_MAX
        );
    }
    if u32::from(size) > osds {
        bail!("--size {size} needs at least {size} OSDs (the cluster has {osds})");
    }
    let min_size = a.min_size.unwrap_or(size - size / 2);
    if min_size == 0 || min_size > size {
        bail!("--min-size {min_size}: between 1 and the pool's size ({size})");
    }
    Ok((size, min_size))
}

/// How to reach an etcd that is secured: TLS files and etcd auth (for `--etcd`; a private
/// etcd makes its own).
#[derive(Args, Debug, Clone, Default)]
pub struct EtcdAccessArgs {
    /// etcd over TLS (https:// endpoints): PEM file of the CA that signed etcd's certificate.
    #[arg(long)]
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate, for an etcd that requires one (--client-cert-auth).
    #[arg(long, requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// PEM private key of --etcd-cert.
    #[arg(long, requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user, when etcd auth is on.
    #[arg(long, requires = "etcd_password_file")]
    pub etcd_user: Option<String>,
    /// File holding that user's password (first line; mode 0600).
    #[arg(long, requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdAccessArgs {
    /// The access these flags give, with absolute paths (daemons run in the cluster
    /// directory, not where the command was typed).
    pub fn access(&self) -> Result<carmine_mapstore::EtcdAccess> {
        let abs = |p: &Option<PathBuf>| -> Result<Option<PathBuf>> {
            p.as_ref()
                .map(|p| std::path::absolute(p).with_context(|| format!("{}", p.display())))
                .transpose()
        };
        Ok(carmine_mapstore::EtcdAccess {
            ca: abs(&self.etcd_ca)?,
            cert: abs(&self.etcd_cert)?,
            key: abs(&self.etcd_key)?,
            user: self.etcd_user.clone(),
            password_file: abs(&self.etcd_password_file)?,
        })
    }
}

fn pid_file(dir: &Path, osd: u32) -> PathBuf {
    dir.join(format!("osd.{osd}.pid"))
}

pub fn map_path(dir: &Path) -> PathBuf {
    dir.join(MAP_FILE)
}

/// The map of the cluster in `dir`, from wherever it lives (file or etcd).
pub fn read_map(dir: &Path) -> Result<OsdMap> {
    let etcd = read_cluster_file(dir)?.and_then(|f| f.etcd);
    let store = maps::open(dir, etcd.as_ref())?;
    let map = store.get().with_context(|| {
        format!(
            "reading the cluster map of {} from {}",
            dir.display(),
            etcd.as_ref()
                .map_or_else(|| map_path(dir).display().to_string(), |e| e.describe())
        )
    })?;
    map.with_context(|| {
        format!(
            "no cluster map in {} (is a cluster up there?)",
            dir.display()
        )
    })
}

/// The `carmine osd` flags that join an OSD to the cluster in `dir`: where the map is, the
/// lease TTL and the key.
pub fn describe_map_source(dir: &Path) -> Result<String> {
    let etcd = read_cluster_file(dir)?.and_then(|f| f.etcd);
    let mut s = match etcd {
        Some(e) => format!(
            "{} --lease-ttl {}",
            e.osd_args().join(" "),
            e.lease_ttl_secs
        ),
        None => format!("--map {}", map_path(dir).display()),
    };
    let in_etcd = read_cluster_file(dir)?
        .and_then(|f| f.etcd)
        .is_some_and(|e| maps::key_in_etcd(&e));
    // With the key in (an authenticating) etcd, the OSD fetches it from there.
    if key_path(dir).exists() && !in_etcd {
        s.push_str(&format!(" --key-file {}", key_path(dir).display()));
    }
    Ok(s)
}

/// The OSDs registered as alive now (in etcd, or beside the map file), with what they said
/// about themselves.
pub fn registrations(
    dir: &Path,
) -> Result<std::collections::BTreeMap<u32, carmine_mapstore::membership::Registration>> {
    let etcd = read_cluster_file(dir)?.and_then(|f| f.etcd);
    Ok(match etcd {
        Some(e) => carmine_mapstore::membership::registered(&e.client()?, &e.cluster)?,
        None => carmine_mapstore::local_membership::local_registered(dir)?,
    })
}

/// The map store of the cluster in `dir` (its file, or its key in etcd).
pub fn map_store(dir: &Path) -> Result<Box<dyn carmine_mapstore::MapStore>> {
    let etcd = read_cluster_file(dir)?.and_then(|f| f.etcd);
    maps::open(dir, etcd.as_ref())
}

/// Connects a client using the map in `dir` for bootstrap addresses.
pub async fn connect(dir: &Path) -> Result<Client> {
    connect_with(dir, ClientConfig::default()).await
}

/// [`connect`] with a client configuration (e.g. a retry timeout).
pub async fn connect_with(dir: &Path, cfg: ClientConfig) -> Result<Client> {
    let map = read_map(dir)?;
    let cfg = ClientConfig {
        key: cfg.key.or(read_key(dir)?),
        ..cfg
    };
    // Up OSDs first: a down one's address only costs a refused connection.
    let mut osds: Vec<&OsdInfo> = map.osds.iter().collect();
    osds.sort_by_key(|o| !o.up);
    let addrs: Vec<SocketAddr> = osds
        .iter()
        .flat_map(|o| o.reactors.iter().copied())
        .collect();
    drop(osds);
    // Starting from the stored map: never route by an older epoch than the store's.
    Client::connect_with_map(&addrs, Some(map), cfg)
        .await
        .context("connecting to the cluster")
}

/// True if `osd`'s endpoints are addresses of this host (it can be started from here).
fn is_local(osd: &OsdInfo) -> bool {
    osd.reactors
        .first()
        .is_some_and(|a| TcpListener::bind((a.ip(), 0)).is_ok())
}

pub use carmine_mapstore::membership::host_name;

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

/// True if `pid` is alive and is a `carmine osd` of this directory (its perf socket is
/// there), so a recycled pid is never signalled.
fn is_our_osd(pid: i32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let in_dir = |a: &&[u8]| {
        let p = Path::new(std::str::from_utf8(a).unwrap_or(""));
        p.parent() == Some(&dir)
            && p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("osd.") && n.ends_with(".perf"))
    };
    args.iter().any(|a| *a == b"osd") && args.iter().any(in_dir) && !is_zombie(pid)
}

pub(crate) fn is_zombie(pid: i32) -> bool {
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
    /// The cluster key (`None` for clusters made before keys existed).
    pub key: Option<AuthKey>,
    /// The OSD processes this process started, by id.
    children: Vec<(u32, std::process::Child)>,
    /// What `up` did, line by line, for the caller to show.
    pub notes: Vec<String>,
}

impl Running {
    /// Stops the OSDs this process started that do not come up (those that exited are
    /// reaped; one still starting gets until the ready timeout), leaving the rest running;
    /// the ones stopped, by name.
    fn stop_unready(&mut self) -> Vec<String> {
        let mut stopped = Vec::new();
        let deadline = Instant::now() + READY_TIMEOUT;
        for (id, child) in &mut self.children {
            let answers = || {
                self.map.osd(*id).is_some_and(|o| {
                    o.reactors
                        .iter()
                        .all(|a| ping(*a, self.key.as_ref()).is_ok())
                })
            };
            let up = loop {
                if !matches!(child.try_wait(), Ok(None)) {
                    break false;
                }
                if answers() {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if up {
                continue;
            }
            // SAFETY: plain syscall on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(pid_file(&self.dir, *id));
            stopped.push(format!("osd.{id}"));
        }
        stopped
    }

    /// Stops the cluster and reaps the OSD processes this process started; returns what
    /// `down` says.
    pub fn down(mut self) -> Result<String> {
        let said = down(&self.dir)?;
        for (_, c) in &mut self.children {
            let _ = c.wait();
        }
        Ok(said)
    }
}

/// The perf socket of OSD `id` (reactor busy/idle counters).
pub fn perf_socket_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("osd.{id}.perf"))
}

/// The cluster key's file: made by `cluster up` for a new cluster, mode 0600.
pub fn key_path(dir: &Path) -> PathBuf {
    dir.join(KEY_FILE)
}

/// The cluster key of `dir`, if the cluster has one.
pub fn read_key(dir: &Path) -> Result<Option<AuthKey>> {
    let path = key_path(dir);
    if !path.exists() {
        return Ok(None);
    }
    Ok(Some(AuthKey::load(&path)?))
}

/// Makes the key of a new cluster in `dir`.
fn make_key(dir: &Path) -> Result<()> {
    let key = AuthKey::from_bytes(rand_key()?);
    key.create_file(&key_path(dir))?;
    Ok(())
}

fn rand_key() -> Result<[u8; 32]> {
    use std::io::Read;
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom for the cluster key")?;
    Ok(b)
}

/// The file holding OSD `id`'s Prometheus metrics address (`ip:port`, at /metrics).
pub fn metrics_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("osd.{id}.metrics"))
}

/// The native store's backing file of OSD `id`.
pub fn store_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("osd.{id}.store"))
}

/// What a cluster directory says about the cluster beyond its map: fixed at creation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ClusterFile {
    store: String,
    /// Where the map lives when not in the file `osdmap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) etcd: Option<maps::EtcdSettings>,
    /// A cluster whose map is the file: its managers (none for one made before they
    /// existed, unless `up --managers` asks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) local_managers: Option<managers::LocalManagers>,
    #[serde(default)]
    pub(crate) failure: FailureDetection,
    /// How its OSD processes run (a cluster made before this was kept: as the flags say).
    #[serde(default)]
    pub(crate) osd_run: run::OsdRun,
}

const CLUSTER_FILE: &str = "cluster.json";

pub(crate) fn read_cluster_file(dir: &Path) -> Result<Option<ClusterFile>> {
    match std::fs::read(dir.join(CLUSTER_FILE)) {
        Ok(raw) => Ok(Some(serde_json::from_slice(&raw).with_context(|| {
            format!("parsing {}", dir.join(CLUSTER_FILE).display())
        })?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", dir.join(CLUSTER_FILE).display())),
    }
}

/// The object store the cluster in `dir` was made with (`memory` or `native`), if known.
pub fn store_kind(dir: &Path) -> Option<String> {
    read_cluster_file(dir).ok().flatten().map(|f| f.store)
}

/// Writes `bytes` to `path` so that a crash leaves the old or the new content, never a mix.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Forgets the cluster in `dir` (map, settings, native store files) so that the next `up`
/// makes a new one. For throw-away clusters (benchmarks); destroys their data.
pub fn forget(dir: &Path) -> Result<()> {
    if !live_osds(dir)?.is_empty() {
        bail!("a cluster is running in {}; stop it first", dir.display());
    }
    managers::stop(dir)?;
    let etcd = read_cluster_file(dir)?.and_then(|f| f.etcd);
    let map = read_map(dir);
    if let Ok(map) = &map {
        for o in &map.osds {
            let _ = std::fs::remove_file(store_path(dir, o.id));
        }
    }
    if etcd.as_ref().is_some_and(|e| e.private) {
        maps::remove_private(dir)?;
    }
    let _ = std::fs::remove_file(dir.join(CLUSTER_FILE));
    let _ = std::fs::remove_file(key_path(dir));
    match std::fs::remove_file(map_path(dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing the map in {}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// Starts the cluster in `a.dir`: a new one when the directory holds none, otherwise exactly
/// the cluster it holds — its map, OSD ids and stores — restarting the OSDs that are not
/// running. A flag that contradicts the existing cluster is refused; nothing is formatted
/// or remapped behind the operator's back.
pub fn up(a: &UpArgs) -> Result<Running> {
    let dir = &a.dir.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = std::fs::canonicalize(dir)?;
    let mut early_notes = Vec::new();
    let mut settings = read_cluster_file(&dir)?;
    let mut started_etcd = false;
    let in_etcd =
        a.with_etcd || a.etcd.is_some() || settings.as_ref().is_some_and(|f| f.etcd.is_some());
    if a.lease_ttl.is_some() && !in_etcd {
        bail!(
            "--lease-ttl is for clusters whose map is in etcd (--with-etcd or --etcd); with the \
             map in a file, an OSD's registration goes with its process, without a lease"
        );
    }
    let access = a.etcd_access.access()?;
    if !access.is_empty() {
        let external = settings
            .as_ref()
            .and_then(|f| f.etcd.as_ref())
            .is_some_and(|e| !e.private);
        let new_external = settings.is_none() && a.etcd.is_some();
        if !external && !new_external {
            bail!(
                "--etcd-ca/--etcd-cert/--etcd-key/--etcd-user/--etcd-password-file are for an \
                 etcd given with --etcd (a private etcd makes and keeps its own)"
            );
        }
    }
    if a.peer_grace.is_some_and(|g| g < PEER_GRACE_MIN_SECS) {
        bail!(
            "--peer-grace {}: at least {PEER_GRACE_MIN_SECS} s (two of the OSDs' read leases; a \
             peer only slow to renew one must not be reported)",
            a.peer_grace.unwrap_or_default()
        );
    }
    if let Some(f) = settings.as_mut() {
        let tuned = f.failure.with_flags(a);
        if tuned != f.failure {
            f.failure = tuned;
            write_atomically(&dir.join(CLUSTER_FILE), &serde_json::to_vec_pretty(f)?)?;
        }
    }
    if let Some(f) = settings.as_mut().filter(|f| f.etcd.is_none()) {
        let wanted = a.managers.is_some() || a.down_out_grace.is_some();
        let now = match &f.local_managers {
            Some(m) => Some(m.with_flags(a)),
            None if wanted => Some(managers::LocalManagers::default().with_flags(a)),
            None => None,
        };
        if now != f.local_managers {
            f.local_managers = now;
            write_atomically(&dir.join(CLUSTER_FILE), &serde_json::to_vec_pretty(f)?)?;
        }
    }
    if let Some(f) = settings.as_mut() {
        if let Some(e) = f.etcd.as_mut() {
            let mut tuned = e.with_flags(a);
            if !access.is_empty() {
                // New paths for the same etcd (certificates renewed, say).
                tuned.access = access.clone();
            }
            if tuned != *e {
                *e = tuned;
                write_atomically(&dir.join(CLUSTER_FILE), &serde_json::to_vec_pretty(f)?)?;
            }
        }
        if let Some(e) = f.etcd.as_mut().filter(|e| e.private) {
            let (now, started) = maps::ensure_private(&dir, e)?;
            if started {
                started_etcd = true;
                early_notes.push(format!("started the private etcd: {}", now.describe()));
            }
            if now != *e {
                *e = now;
                write_atomically(&dir.join(CLUSTER_FILE), &serde_json::to_vec_pretty(f)?)?;
            }
        }
    }
    let res = up_from(&dir, a, settings, early_notes);
    // A refused or failed `up` leaves nothing running that it started — but the map store
    // stays while OSDs or managers run on it (a restart that brought back all but one).
    let in_use =
        || live_osds(&dir).is_ok_and(|l| !l.is_empty()) || !managers::live(&dir).is_empty();
    if res.is_err() && started_etcd && !in_use() {
        let _ = maps::stop_private(&dir);
    }
    res
}

/// `up` once the private etcd (if any) runs.
fn up_from(
    dir: &Path,
    a: &UpArgs,
    settings: Option<ClusterFile>,
    mut early_notes: Vec<String>,
) -> Result<Running> {
    let dir = dir.to_owned();
    let etcd = settings.as_ref().and_then(|f| f.etcd.clone());
    let restart = maps::open(&dir, etcd.as_ref())?
        .get()
        .with_context(|| format!("reading the cluster map of {}", dir.display()))?
        .is_some();
    let (map, store, mut notes) = if restart {
        existing_cluster(&dir, a, etcd.as_ref())?
    } else {
        new_cluster(&dir, a, settings.as_ref())?
    };
    early_notes.append(&mut notes);
    let notes = early_notes;
    // Before anything starts: a key others can read is refused, not used.
    let key = read_key(&dir)?;
    let etcd = read_cluster_file(&dir)?.and_then(|f| f.etcd);
    if let (Some(e), Some(k)) = (&etcd, &key) {
        maps::publish_key(e, k)?;
    }
    let live = live_osds(&dir)?;
    // OSDs added on other hosts (`osd add --host`) are started there, not here.
    let to_start: Vec<u32> = map
        .osds
        .iter()
        .filter(|o| is_local(o))
        .map(|o| o.id)
        .filter(|id| !live.iter().any(|(l, _)| l == id))
        .collect();
    let plan = read_cluster_file(&dir)?.and_then(|f| managers::Plan::of(&dir, &f));
    let managers_missing = plan
        .as_ref()
        .is_some_and(|p| managers::live(&dir).len() < p.count as usize);
    if to_start.is_empty() && !managers_missing {
        bail!(
            "the cluster in {} is already running ({} OSDs); run `carmine cluster down` first",
            dir.display(),
            live.len()
        );
    }
    let mut notes = notes;
    if restart {
        // Only an `up` that goes ahead changes how the OSDs run (a refused one changes
        // nothing, and could not say so).
        if let Some(mut f) = read_cluster_file(&dir)? {
            let (run, mut changes) = f.osd_run.with_flags(a);
            if run != f.osd_run {
                f.osd_run = run;
                write_atomically(&dir.join(CLUSTER_FILE), &serde_json::to_vec_pretty(&f)?)?;
                notes.append(&mut changes);
            }
        }
        let names: Vec<String> = to_start.iter().map(|id| format!("osd.{id}")).collect();
        let mut line = format!("restarting {} from {}", names.join(", "), dir.display());
        if !live.is_empty() {
            let running: Vec<String> = live
                .iter()
                .map(|(id, pid)| format!("osd.{id} (pid {pid})"))
                .collect();
            line.push_str(&format!("; already running: {}", running.join(", ")));
        }
        notes.insert(0, line);
    }
    let run = osd_run(&dir, a)?;
    let mut children = Vec::with_capacity(to_start.len());
    let exe = match &a.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe().context("locating the carmine binary")?,
    };
    let mut start = |id: u32| start_osd(&exe, &dir, id, &store, etcd.as_ref(), a, &run);
    for &id in &to_start {
        let child = start(id)?;
        std::fs::write(pid_file(&dir, id), child.id().to_string())?;
        children.push((id, child));
    }
    let mut running = Running {
        key,
        dir: dir.clone(),
        map,
        children,
        notes,
    };
    let ready =
        ports::ready_or_moved(&mut running, &to_start, etcd.as_ref(), &mut start).and_then(|()| {
            match &plan {
                Some(p) => managers::start(&exe, &mut running, &to_start, p, etcd.as_ref()),
                None => Ok(()),
            }
        });
    if let Err(e) = ready {
        if restart {
            // A restart brings back what it can. The OSDs that were running, and those of
            // this `up` that came up, go on serving: stopping the whole cluster because one
            // OSD cannot start (a failed disk) would take its PGs' other copies down with it.
            let stopped = running.stop_unready();
            if let Some(p) = &plan {
                if let Err(m) = managers::ensure(&exe, &dir, p) {
                    return Err(e.context(format!("and starting the managers: {m:#}")));
                }
            }
            return Err(e.context(match stopped.is_empty() {
                true => "every OSD of this `up` runs".to_string(),
                false => format!(
                    "{} not started; every other OSD keeps running",
                    stopped.join(", ")
                ),
            }));
        }
        let _ = running.down();
        // A new cluster that never came up has served nothing: leave no half-made cluster
        // (a map, store files cut short by a full disk) for the next `up`.
        if let Err(f) = forget(&dir) {
            return Err(e.context(format!("and cleaning up the new cluster: {f:#}")));
        }
        return Err(e.context(format!(
            "the new cluster in {} did not come up and was removed",
            dir.display()
        )));
    }
    let reactors = running.map.osds.first().map_or(0, |o| o.reactors.len());
    let pool = &running.map.pools[0];
    running.notes.push(format!(
        "cluster up in {}: {} OSD(s) x {} reactor(s), {} store, pool {:?} with {} PGs, {} cop{} \
         (min {}), map epoch {}",
        dir.display(),
        running.map.osds.len(),
        reactors,
        store,
        pool.name,
        pool.pg_num,
        pool.size,
        if pool.size == 1 { "y" } else { "ies" },
        pool.min_size,
        running.map.epoch
    ));
    for o in &running.map.osds {
        let eps: Vec<String> = o.reactors.iter().map(|r| r.to_string()).collect();
        running
            .notes
            .push(format!("  osd.{}: {}", o.id, eps.join(" ")));
    }
    if !run.no_pin {
        let (topo, alloc) = placement(&running.map, run.cpu_set.as_deref(), run.cpu_policy())?;
        running.notes.push(alloc.grid(&topo).trim_end().to_string());
    }
    Ok(running)
}

/// A new cluster's map and settings, written to `dir`.
fn new_cluster(
    dir: &Path,
    a: &UpArgs,
    settings: Option<&ClusterFile>,
) -> Result<(OsdMap, String, Vec<String>)> {
    if let Some(e) = settings.and_then(|f| f.etcd.as_ref()) {
        bail!(
            "{} says its map lives in {}, but there is none there: refusing to create a new \
             cluster over it (its stores may hold data). Restore the map, or use another \
             directory",
            dir.join(CLUSTER_FILE).display(),
            e.describe()
        );
    }
    let store = a.store.clone().unwrap_or_else(|| "memory".into());
    if store != "memory" && store != "native" {
        bail!("unknown store {store:?}: this build supports `memory` and `native`");
    }
    let (osds, reactors) = (a.osds.unwrap_or(1), a.reactors.unwrap_or(1));
    if osds == 0 || reactors == 0 {
        bail!("--osds and --reactors must be at least 1");
    }
    if store == "native" {
        // Stranded stores of an earlier cluster whose map is gone: never format over them.
        for id in 0..osds {
            let p = store_path(dir, id);
            if p.exists() && std::fs::metadata(&p)?.len() > 0 {
                bail!(
                    "{} exists but {} holds no cluster map: it may hold another cluster's \
                     data. Move it away (or remove it) to create a new cluster here",
                    p.display(),
                    dir.display()
                );
            }
        }
    }
    let (size, min_size) = pool_copies(a, osds)?;
    let addrs = ports::free_addrs(a.host, (osds * reactors) as usize)?;
    // Weights are capacities in TiB, as the OSDs will register them.
    let capacity = match store.as_str() {
        "native" => a.device_size.unwrap_or(DEVICE_SIZE_DEFAULT),
        _ => a
            .memory_limit
            .unwrap_or(run::MEMORY_LIMIT_DEFAULT)
            .saturating_mul(u64::from(reactors)),
    };
    let mut map = OsdMap {
        epoch: 1,
        osds: (0..osds)
            .map(|id| OsdInfo {
                weight: carmine_cluster::weight_of_capacity(capacity),
                ..OsdInfo::new(
                    id,
                    &host_name(),
                    addrs[(id * reactors) as usize..((id + 1) * reactors) as usize].to_vec(),
                )
            })
            .collect(),
        pools: vec![Pool {
            id: 1,
            name: a.pool.clone().unwrap_or_else(|| "rbd".into()),
            pg_num: a.pg_num.unwrap_or(64),
            size,
            min_size,
        }],
        upmaps: Default::default(),
        pg_temp: Default::default(),
        pool_max: 1,
        given_copies: Default::default(),
    };
    // Balanced at birth, while no PG holds data: hashing alone leaves some OSDs ~12% fuller
    // than the mean (8 OSDs x 256 PGs); placement exceptions bring that within one PG.
    map.balance(1, usize::MAX);
    map.validate()?;
    let mut notes = Vec::new();
    let etcd = if a.with_etcd {
        let wanted = maps::EtcdSettings {
            endpoints: Vec::new(),
            private: true,
            cluster: maps::new_cluster_name(),
            managers: managers::MANAGERS_DEFAULT,
            lease_ttl_secs: maps::lease_ttl_default(),
            down_out_grace_secs: maps::grace_default(),
            secure: true,
            access: Default::default(),
        }
        .with_flags(a);
        let (e, _) = maps::ensure_private(dir, &wanted)?;
        notes.push(format!("started the private etcd: {}", e.describe()));
        Some(e)
    } else {
        let access = a.etcd_access.access()?;
        a.etcd.as_ref().map(|endpoints| {
            maps::EtcdSettings {
                endpoints: endpoints.clone(),
                private: false,
                cluster: maps::new_cluster_name(),
                managers: managers::MANAGERS_DEFAULT,
                lease_ttl_secs: maps::lease_ttl_default(),
                down_out_grace_secs: maps::grace_default(),
                secure: false,
                access,
            }
            .with_flags(a)
        })
    };
    // A key for every new cluster (one left by an earlier cluster here is taken over).
    if read_key(dir)?.is_none() {
        make_key(dir)?;
        notes.push(format!(
            "cluster key: {} (mode 0600; every connection authenticates with it)",
            key_path(dir).display()
        ));
    }
    // The settings first: they say where the map is.
    write_atomically(
        &dir.join(CLUSTER_FILE),
        &serde_json::to_vec_pretty(&ClusterFile {
            store: store.clone(),
            local_managers: etcd
                .is_none()
                .then(|| managers::LocalManagers::default().with_flags(a)),
            etcd: etcd.clone(),
            failure: FailureDetection::default().with_flags(a),
            osd_run: run::OsdRun::default().with_flags(a).0,
        })?,
    )?;
    let stored = maps::open(dir, etcd.as_ref()).and_then(|store| {
        store
            .swap(None, &map)
            .context("storing the new cluster's map")
    });
    if let Err(e) = stored {
        // Nothing of the new cluster stays behind: not its settings, not its private etcd.
        let _ = std::fs::remove_file(dir.join(CLUSTER_FILE));
        if a.with_etcd {
            let _ = maps::remove_private(dir);
        }
        return Err(e);
    }
    if let Some(e) = &etcd {
        notes.push(format!("map: {}", e.describe()));
    }
    Ok((map, store, notes))
}

/// The cluster `dir` holds, checked against the flags; endpoints whose ports were taken
/// meanwhile move, in a new map epoch.
fn existing_cluster(
    dir: &Path,
    a: &UpArgs,
    etcd: Option<&maps::EtcdSettings>,
) -> Result<(OsdMap, String, Vec<String>)> {
    let mut map = read_map(dir)?;
    let read = map.clone();
    let mut notes = Vec::new();
    // Clusters made before the settings file existed: native if any store file is there.
    let store = match read_cluster_file(dir)? {
        Some(f) => f.store,
        None if map.osds.iter().any(|o| store_path(dir, o.id).exists()) => "native".into(),
        None => "memory".into(),
    };
    let reactors = map.osds.first().map_or(0, |o| o.reactors.len() as u32);
    let pool = map.pools.first().context("the map has no pool")?.clone();
    let mut conflicts = Vec::new();
    let mut check = |flag: &str, given: Option<String>, have: String| {
        if let Some(g) = given {
            if g != have {
                conflicts.push(format!("--{flag} {g} (the cluster has {have})"));
            }
        }
    };
    check(
        "osds",
        a.osds.map(|v| v.to_string()),
        map.osds.len().to_string(),
    );
    check(
        "reactors",
        a.reactors.map(|v| v.to_string()),
        reactors.to_string(),
    );
    check("store", a.store.clone(), store.clone());
    check("pool", a.pool.clone(), pool.name.clone());
    check(
        "pg-num",
        a.pg_num.map(|v| v.to_string()),
        pool.pg_num.to_string(),
    );
    check("size", a.size.map(|v| v.to_string()), pool.size.to_string());
    check(
        "min-size",
        a.min_size.map(|v| v.to_string()),
        pool.min_size.to_string(),
    );
    let here = |e: Option<&maps::EtcdSettings>| match e {
        Some(e) if e.private => "a private etcd".to_string(),
        Some(e) => format!("etcd {}", e.endpoints.join(",")),
        None => "the file osdmap".to_string(),
    };
    if a.with_etcd && !etcd.is_some_and(|e| e.private) {
        conflicts.push(format!("--with-etcd (the map is in {})", here(etcd)));
    }
    if let Some(given) = &a.etcd {
        if etcd.is_none_or(|e| e.private || e.endpoints != *given) {
            conflicts.push(format!(
                "--etcd {} (the map is in {})",
                given.join(","),
                here(etcd)
            ));
        }
    }
    if !conflicts.is_empty() {
        bail!(
            "{} already holds a cluster; `up` restarts it as it is, and these flags contradict \
             it: {}. Membership changes will be explicit commands (`carmine osd add|rm`, with \
             the data moving to its new places); until then the OSDs of a cluster are fixed. \
             To make a new cluster, use another directory",
            dir.display(),
            conflicts.join(", ")
        );
    }
    if a.device_size.is_some() && store == "native" {
        notes.push(
            "note: --device-size applies to new stores only; the existing ones keep their size"
                .into(),
        );
    }
    if store == "native" {
        for o in &map.osds {
            let p = store_path(dir, o.id);
            if !p.exists() {
                bail!(
                    "osd.{}'s store {} is missing: refusing to start it empty (its data would \
                     be gone while the map still gives it PGs)",
                    o.id,
                    p.display()
                );
            }
        }
    } else {
        notes.push("note: memory store: data written before the restart is gone".into());
    }
    // Endpoints of OSDs that are not running must be free to bind again.
    let live = live_osds(dir)?;
    let mut moved = 0;
    for o in map
        .osds
        .iter_mut()
        .filter(|o| !live.iter().any(|(id, _)| *id == o.id))
    {
        for r in o.reactors.iter_mut() {
            if !ports::bindable_soon(*r) {
                let new = ports::free_addrs(r.ip(), 1)?[0];
                notes.push(format!("osd.{}: {} is taken; moving to {}", o.id, r, new));
                *r = new;
                moved += 1;
            }
        }
    }
    if moved > 0 {
        map.epoch += 1;
        maps::open(dir, etcd)?
            .swap(Some(&read), &map)
            .context("storing the map with the moved endpoints")?;
    }
    Ok((map, store, notes))
}

/// How the OSDs of the cluster in `dir` run: as its settings file keeps it (with this `up`'s
/// flags already in), or as the flags say for a cluster made before it was kept.
fn osd_run(dir: &Path, a: &UpArgs) -> Result<run::OsdRun> {
    let run = match read_cluster_file(dir)? {
        Some(f) => f.osd_run,
        None => run::OsdRun::default().with_flags(a).0,
    };
    if let Some(p) = &run.cpu_policy {
        p.parse::<CpuPolicy>().map_err(|e| {
            anyhow::anyhow!(
                "{}: cpu policy {p:?}: {e}",
                dir.join(CLUSTER_FILE).display()
            )
        })?;
    }
    Ok(run)
}

fn start_osd(
    exe: &Path,
    dir: &Path,
    id: u32,
    store: &str,
    etcd: Option<&maps::EtcdSettings>,
    a: &UpArgs,
    run: &run::OsdRun,
) -> Result<std::process::Child> {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("osd.{id}.log")))?;
    // Where this run's lines begin: what `up` reads of the log looks no further back.
    {
        use std::io::Write;
        writeln!(log, "{}", ports::run_marker(id))?;
    }
    let mut cmd = Command::new(exe);
    cmd.arg("osd").arg("--id").arg(id.to_string());
    match etcd {
        None => cmd.arg("--map").arg(map_path(dir)),
        Some(e) => cmd
            .args(e.osd_args())
            .arg("--lease-ttl")
            .arg(e.lease_ttl_secs.to_string()),
    };
    let failure = read_cluster_file(dir)?
        .map(|f| f.failure)
        .unwrap_or_default();
    cmd.arg("--peer-grace")
        .arg(format!("{}s", failure.peer_grace_secs));
    cmd.arg("--perf-socket").arg(perf_socket_path(dir, id));
    if key_path(dir).exists() {
        cmd.arg("--key-file").arg(key_path(dir));
    }
    // Metrics on a free loopback port, recorded for `status` and scrapers.
    let metrics = ports::free_addrs([127, 0, 0, 1].into(), 1)?[0];
    std::fs::write(metrics_path(dir, id), metrics.to_string())?;
    cmd.arg("--metrics").arg(metrics.to_string());
    if store == "native" {
        let device = store_path(dir, id);
        cmd.arg("--store")
            .arg("native")
            .arg("--device")
            .arg(&device);
        // Only a store file that does not exist yet is created and formatted; an existing
        // one is mounted as it is (the OSD refuses to format anything but a blank device).
        if !device.exists() {
            cmd.arg("--mkfs")
                .arg("--device-size")
                .arg(a.device_size.unwrap_or(DEVICE_SIZE_DEFAULT).to_string());
        }
    }
    cmd.args(run.osd_args(store == "native"));
    // Own process group: a Ctrl-C aimed at the shell does not take the cluster down.
    use std::os::unix::process::CommandExt;
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    cmd.spawn().with_context(|| format!("starting osd.{id}"))
}

/// One round trip to reactor `addr`, after the handshake if the cluster has a `key`.
/// Gives up after `PING_TIMEOUT`: a host cut off by a partition drops packets, and TCP's own
/// connect timeout is minutes.
pub fn ping(addr: SocketAddr, key: Option<&AuthKey>) -> Result<Duration> {
    carmine_reactor::block_on(async move {
        let attempt = async {
            let conn = carmine_client::Connection::open_with(addr, 1, key).await?;
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
        };
        carmine_reactor::timeout(PING_TIMEOUT, attempt)
            .await
            .unwrap_or_else(|_| bail!("no answer within {PING_TIMEOUT:?}"))
    })
}

/// How long `status` and `up` wait for one reactor's ping.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Stops the OSDs running in `dir`; returns a one-line summary.
pub fn down(dir: &Path) -> Result<String> {
    let dir = std::fs::canonicalize(dir)
        .with_context(|| format!("no cluster directory {}", dir.display()))?;
    // The managers first: a planned stop is not a failure, so it makes no epochs.
    let mgrs = managers::stop(&dir)?;
    let live = live_osds(&dir)?;
    for (_, pid) in &live {
        // SAFETY: plain syscall; the pid was just checked to be one of our OSDs.
        unsafe { libc::kill(*pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    let mut killed = Vec::new();
    for (id, pid) in &live {
        while is_our_osd(*pid, &dir) {
            if Instant::now() > deadline {
                // SAFETY: as above.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
                killed.push(format!("osd.{id} (pid {pid})"));
                std::thread::sleep(Duration::from_millis(100));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for e in std::fs::read_dir(&dir)?.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("osd.") && (n.ends_with(".pid") || n.ends_with(".metrics")) {
            std::fs::remove_file(e.path())?;
        }
    }
    let etcd = if maps::stop_private(&dir)? {
        " and the private etcd"
    } else {
        ""
    };
    let mgrs = if mgrs > 0 {
        format!(", {mgrs} manager(s)")
    } else {
        String::new()
    };
    Ok(format!(
        "cluster down in {}: stopped {} OSD(s){mgrs}{etcd}{}",
        dir.display(),
        live.len(),
        if killed.is_empty() {
            String::new()
        } else {
            format!(
                "; {} ignored SIGTERM for {STOP_TIMEOUT:?} and got SIGKILL",
                killed.join(", ")
            )
        }
    ))
}

/// `--cleaner-rate`: a size per second, 0 for none; below 1 MiB/s one victim would pause
/// housekeeping for minutes, so that is refused.
pub fn parse_cleaner_rate(s: &str) -> Result<u64, String> {
    let rate = parse_size(s)?;
    if rate != 0 && rate < 1 << 20 {
        return Err(format!(
            "{s} per second is too slow for the cleaner: 0 (no pacing) or at least 1M"
        ));
    }
    Ok(rate)
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

#[cfg(test)]
mod tests;
