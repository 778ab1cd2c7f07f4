//! `carmine osd`: one OSD daemon in the foreground until SIGTERM or SIGINT.

use crate::osd_control::{Control, MapSource};
use crate::size::parse_size;
use anyhow::{bail, Context, Result};
use carmine_cluster::OsdMap;
use carmine_mapstore::membership::Registration;
use carmine_osd::{Osd, OsdConfig, StoreConfig, READ_LEASE_MAX};
use carmine_reactor::cpu::CpuPolicy;
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum StoreKind {
    /// In-memory store (like Crimson's CyanStore): nothing survives a restart.
    Memory,
    /// The native log-structured store on `--device` (like SeaStore): persistent.
    Native,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Durability {
    /// fdatasync before acknowledging: survives power loss.
    PowerLoss,
    /// O_DSYNC writes (FUA where the device has it) instead of a separate fdatasync: survives
    /// power loss.
    PowerLossDsync,
    /// Acknowledge once O_DIRECT writes complete: survives a crash of the process only.
    ProcessCrash,
}

/// `carmine osd`: the daemon's flags, or an admin subcommand.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct OsdCommand {
    #[command(subcommand)]
    pub admin: Option<crate::osd_admin::OsdAdmin>,
    #[command(flatten)]
    pub daemon: Option<OsdArgs>,
    /// With --etcd: TLS files and credentials (flattened here, not in `OsdArgs`: clap does
    /// not see an optional flattened group as present through a nested one).
    #[command(flatten)]
    pub etcd_access: carmine_localcluster::EtcdAccessArgs,
}

#[derive(Args, Debug)]
pub struct OsdArgs {
    /// This OSD's id in the cluster map.
    #[arg(long)]
    pub id: u32,
    /// Cluster map file written by `cluster up` (or give --etcd).
    #[arg(long, required_unless_present = "etcd", conflicts_with = "etcd")]
    pub map: Option<PathBuf>,
    /// Read the cluster map from this etcd (http://host:port, comma-separated members).
    #[arg(long, value_delimiter = ',', requires = "cluster_name")]
    pub etcd: Option<Vec<String>>,
    /// The cluster's name in etcd (its map is /carmine/NAME/osdmap).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// With --etcd: the TTL of the lease that keeps this OSD registered as alive. Once it runs
    /// out (the OSD died, or lost etcd that long) a manager marks it down.
    #[arg(long, default_value = "5", value_parser = crate::nbd::parse_duration)]
    pub lease_ttl: Duration,
    /// Object store backend.
    #[arg(long, value_enum, default_value = "memory")]
    pub store: StoreKind,
    /// Memory budget of each reactor's memory-store shard (e.g. 2G).
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    pub memory_limit: u64,
    /// Native store: its file or block device.
    #[arg(long, required_if_eq("store", "native"))]
    pub device: Option<PathBuf>,
    /// Native store: format the device if it is blank (missing, empty, or all zeros; with
    /// --device-size, create the file). A device holding anything else is never formatted
    /// here: use `carmine store mkfs --force` for that.
    #[arg(long)]
    pub mkfs: bool,
    /// Native store: size of the file `--mkfs` creates.
    #[arg(long, value_parser = parse_size)]
    pub device_size: Option<u64>,
    /// Native store: data cache per reactor shard.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub cache: u64,
    /// Native store: metadata tree nodes kept in memory per reactor shard.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub metadata_cache: u64,
    /// Native store: object bodies (extent maps, xattrs, omap) kept in memory per reactor
    /// shard, counted as the bytes their records take; clean ones beyond it are paged out
    /// and read back from the metadata tree when used.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub object_cache: u64,
    /// Native store: object bodies changed since the last checkpoint (counted as
    /// `--object-cache` counts them) past which a checkpoint is written early, so memory
    /// stays bounded on volumes far wider than the object cache; each early checkpoint
    /// pages out bodies the next writes read back.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub dirty_metadata: u64,
    /// Native store: bytes per second (read and moved) the background cleaner keeps to per
    /// shard while clients do I/O; 0 (the default) for no pacing. Writers that clean because
    /// space is short are never paced. Pacing suits light writes next to heavy reads: under
    /// sustained writes the cleaner falls behind and writers clean in their own path.
    #[arg(long, default_value_t = carmine_nativestore::CLEANER_BUSY_RATE_DEFAULT,
          value_parser = carmine_localcluster::parse_cleaner_rate)]
    pub cleaner_rate: u64,
    /// Native store: journal writes (a write of gathered records and its sync) in flight at
    /// once per shard. More overlaps the next write with the current sync, at the price of
    /// smaller group commits.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub journal_writes: u32,
    /// Native store: when a write is acknowledged.
    #[arg(long, value_enum, default_value = "power-loss")]
    pub durability: Durability,
    /// Cores the OSDs may use (e.g. "1" or "0-3,8"); other cores stay free for clients.
    #[arg(long)]
    pub cpu_set: Option<String>,
    /// Reactor placement: default (contiguous), osd (one socket per OSD), socket (spread).
    #[arg(long, default_value = "default")]
    pub cpu_policy: CpuPolicy,
    /// Do not pin reactors to cores.
    #[arg(long)]
    pub no_pin: bool,
    /// Open client connections per reactor; more are refused.
    #[arg(long, default_value_t = carmine_osd::CONNECTIONS_MAX_DEFAULT)]
    pub connections_max: u32,
    /// Close a client connection that makes no progress for this long while the client is to
    /// blame (idle, stalled mid-request, or not reading its replies): seconds, or "10m",
    /// "500ms". 0 never closes one.
    #[arg(long, default_value = "600", value_parser = crate::nbd::parse_duration)]
    pub idle_timeout: Duration,
    /// How often each replicated PG's copies are compared (lists, versions, sizes) on their
    /// own: seconds, or "30m", "24h". 0 never.
    #[arg(long, default_value = "24h", value_parser = crate::nbd::parse_duration)]
    pub scrub_interval: Duration,
    /// How often each replicated PG's copies are compared byte for byte (every copy read in
    /// full). 0 never.
    #[arg(long, default_value = "7d", value_parser = crate::nbd::parse_duration)]
    pub deep_scrub_interval: Duration,
    /// MiB per second each reactor copies to recover replicated PGs in the background
    /// (objects a client waits for are copied first, whatever the rate). 0: no limit.
    #[arg(long, default_value_t = carmine_osd::RECOVERY_RATE_DEFAULT >> 20)]
    pub recovery_rate_mib: u64,
    /// The same while clients are active on the reactor (a read or write of theirs, or a
    /// replica write, came in the last 100 ms): client I/O first. 0: the rate above (which
    /// also caps this one).
    #[arg(long, default_value_t = carmine_osd::RECOVERY_BUSY_RATE_DEFAULT >> 20)]
    pub recovery_busy_rate_mib: u64,
    /// Objects each reactor recovers at once, all its PGs together: each is a whole object
    /// in memory until stored, and its fetch overlaps the others'. Objects clients wait for
    /// may take as many again.
    #[arg(long, default_value_t = carmine_osd::RECOVERY_MAX_ACTIVE_DEFAULT,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub recovery_max_active: usize,
    /// Objects a copy must lack of a PG (and at least half of them: back empty, or gone long)
    /// for the PG to be served by its other copies while it fills as a backfill target (a
    /// temporary acting set). Below it the copy is recovered in place, clients' writes
    /// waiting for the objects they touch; a set costs a primary change each way (a read
    /// lease's wait).
    #[arg(long, default_value_t = carmine_osd::BACKFILL_MIN_OBJECTS_DEFAULT)]
    pub backfill_min_objects: usize,
    /// The read lease the copies of replicated PGs grant their primary: a primary cut off from
    /// its copies stops serving reads within it, and after a failover the new primary waits
    /// out what its copies granted the old one before it serves. Keep it at most the lease
    /// TTL, or failovers take longer than the TTL says.
    #[arg(long, default_value = "2s", value_parser = parse_read_lease)]
    pub read_lease: Duration,
    /// How long a replicated PG of this OSD waits on another OSD that does not answer before
    /// this OSD reports it to the managers, which may mark it down (a hung OSD, or a link
    /// broken between two OSDs that both still reach the map store). At least two read
    /// leases.
    #[arg(long, default_value = "10s", value_parser = crate::nbd::parse_duration)]
    pub peer_grace: Duration,
    /// Microseconds an idle reactor keeps polling for work before it sleeps in the kernel (0:
    /// sleep at once). Cuts the wake-up cost out of a request-at-a-time client's latency, at
    /// the price of the poll's CPU: for reactors with a core of their own. Default: 50 when
    /// `--cpu-set` is given and every reactor of this OSD is pinned to a core of it that no
    /// other reactor of the cluster's placement uses, else 0 (a poller slows down whatever
    /// shares its core).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub idle_poll_us: Option<u64>,
    /// The cluster key (64 hex characters, a file of mode 0600): every connection must
    /// authenticate with it before any request is read. Without it, none is asked for.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Serve Prometheus metrics (text format) at http://ADDR/metrics: requests, failures and
    /// latency histograms by kind, bytes, connections, map epoch, PGs, reactor busy/idle/CPU.
    #[arg(long)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Serve the reactors' busy/idle counters as JSON on this Unix socket
    /// (`carmine cluster perf` and `carmine bench` read it).
    #[arg(long)]
    pub perf_socket: Option<PathBuf>,
}

/// The idle poll when `--idle-poll-us` is not given and every reactor has a core of its own.
const IDLE_POLL_OWN_CORE: Duration = Duration::from_micros(50);

/// Where this OSD's reactors run.
struct Placement {
    cpus: Vec<Option<u32>>,
    grid: String,
    /// Every reactor is pinned to a core that no other reactor of the placement uses, within
    /// a cpu set the operator gave (without one, the placement may put the reactors on every
    /// core there is, beside the clients and whatever else runs).
    own_cores: bool,
}

/// CPU for each reactor of `osd`, placed by the policy over the whole cluster's OSDs so that
/// OSDs started as separate processes still get disjoint cores.
fn reactor_cpus(
    map: &OsdMap,
    osd: u32,
    cpu_set: Option<&str>,
    policy: CpuPolicy,
) -> Result<Placement> {
    let (topo, alloc) = carmine_localcluster::placement(map, cpu_set, policy)?;
    let index = map
        .osds
        .iter()
        .position(|o| o.id == osd)
        .context("osd not in map")?;
    let mine = alloc.cpus(index as u32);
    Ok(Placement {
        cpus: mine.iter().map(|c| Some(*c)).collect(),
        grid: alloc.grid(&topo),
        own_cores: cpu_set.is_some()
            && !mine.is_empty()
            && mine.iter().all(|&c| alloc.reactors_on(c) == 1),
    })
}

/// The idle poll: as given, or on only where it cannot slow another reactor down.
fn idle_poll(given: Option<u64>, own_cores: bool) -> (Duration, &'static str) {
    match given {
        Some(us) => (Duration::from_micros(us), "as given"),
        None if own_cores => (IDLE_POLL_OWN_CORE, "each reactor has a core of its own"),
        None => (
            Duration::ZERO,
            "reactors share cores, are not pinned, or have no --cpu-set",
        ),
    }
}

fn map_source(a: &OsdArgs, access: &carmine_localcluster::EtcdAccessArgs) -> Result<MapSource> {
    Ok(match (&a.map, &a.etcd) {
        (Some(path), _) => MapSource::File(path.clone()),
        (None, Some(endpoints)) => MapSource::Etcd {
            endpoints: endpoints.clone(),
            cluster: a
                .cluster_name
                .clone()
                .context("--cluster-name is required")?,
            access: access.access()?,
        },
        (None, None) => bail!("give --map or --etcd"),
    })
}

/// The cluster key stored in etcd, if any.
fn key_from_etcd(source: &MapSource) -> Result<Option<carmine_proto::auth::AuthKey>> {
    let MapSource::Etcd {
        endpoints,
        cluster,
        access,
    } = source
    else {
        return Ok(None);
    };
    let store = carmine_mapstore::EtcdMapStore::with_access(endpoints, access, cluster)?;
    let Some(hex) = store
        .stored_key()
        .context("reading the cluster key from etcd")?
    else {
        return Ok(None);
    };
    let key = carmine_proto::auth::AuthKey::parse_hex(&hex)
        .context("the cluster key in etcd is not 64 hex characters")?;
    println!("cluster key from etcd");
    Ok(Some(key))
}

/// The map the OSD starts with; newer epochs arrive while it runs.
fn load_map(source: &MapSource) -> Result<OsdMap> {
    let from = source.describe();
    source
        .open()?
        .get()
        .with_context(|| format!("reading the cluster map from {from}"))?
        .with_context(|| format!("no cluster map in {from}"))
}

pub fn run(a: OsdArgs, access: &carmine_localcluster::EtcdAccessArgs) -> Result<()> {
    if a.peer_grace < 2 * a.read_lease {
        bail!(
            "--peer-grace {:?} is shorter than two read leases ({:?}): a peer that is only slow \
             to renew one would be reported",
            a.peer_grace,
            2 * a.read_lease
        );
    }
    let source = map_source(&a, access)?;
    if matches!(source, MapSource::Etcd { .. }) && a.peer_grace <= a.lease_ttl {
        eprintln!(
            "warning: --peer-grace {:?} is not longer than --lease-ttl {:?}: peers will report a \
             crashed OSD before its lease runs out, and it is then held down when it restarts",
            a.peer_grace, a.lease_ttl
        );
    }
    Control::check_not_running(&source, a.id)?;
    let map = load_map(&source)?;
    let epoch = map.epoch;
    let info = map
        .osd(a.id)
        .with_context(|| format!("osd.{} is not in the map", a.id))?
        .clone();
    let (reactor_cpus, own_cores) = if a.no_pin {
        (vec![None; info.reactors.len()], false)
    } else {
        let p = reactor_cpus(&map, a.id, a.cpu_set.as_deref(), a.cpu_policy)?;
        println!("{}", p.grid);
        (p.cpus, p.own_cores)
    };
    let store = match a.store {
        StoreKind::Memory => StoreConfig::Memory {
            memory_limit_bytes: a.memory_limit,
        },
        StoreKind::Native => native_store(&a, info.reactors.len() as u32)?,
    };
    let auth_key = match (&a.key_file, &source) {
        (Some(path), _) => Some(carmine_proto::auth::AuthKey::load(path)?),
        // Without a key file, an OSD of a cluster in etcd takes the key etcd holds (only an
        // authenticating etcd holds one): it must never serve unauthenticated by accident.
        (None, MapSource::Etcd { .. }) => key_from_etcd(&source)?,
        (None, MapSource::File(_)) => None,
    };
    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .context("installing signal handlers")?;
    // Read leases granted by this OSD's earlier run are in no store: a new primary learns how
    // long they may still run from this OSD, which takes them to run one lease past its start
    // — the longest lease a recent run used, if `--read-lease` was shortened (decision 0009).
    let lease_record = source.read_lease_record(a.id)?;
    let (poll, why) = idle_poll(a.idle_poll_us, own_cores);
    println!("osd.{}: idle poll {} µs ({why})", a.id, poll.as_micros());
    carmine_reactor::set_idle_poll(poll);
    // No run may have used more than the longest lease allowed, whatever a record says.
    let prior_read_lease = lease_record
        .starting(a.read_lease)
        .context("reading the OSD's read lease record")?
        .min(READ_LEASE_MAX)
        .max(a.read_lease);
    if prior_read_lease > a.read_lease {
        println!(
            "osd.{}: an earlier run used read leases of {prior_read_lease:?}; its promises are \
             taken to run that long after this start",
            a.id
        );
        let (shorter, id) = (a.read_lease, a.id);
        std::thread::Builder::new()
            .name(format!("osd{id}-lease-record"))
            .spawn(move || {
                // Once they are over, the record says this run's lease.
                std::thread::sleep(prior_read_lease);
                if let Err(e) = lease_record.set(shorter) {
                    eprintln!("warning: osd.{id}: recording the read lease: {e}");
                }
            })?;
    }
    // With etcd, clients are served only while the lease surely holds (decision 0009).
    let lease = matches!(source, MapSource::Etcd { .. })
        .then(|| std::sync::Arc::new(carmine_osd::LeaseClock::new(a.lease_ttl)));
    let map_at_start = map.clone();
    let osd = Osd::start(OsdConfig {
        id: a.id,
        map,
        reactor_cpus: reactor_cpus.clone(),
        store,
        connections_max: a.connections_max,
        idle_timeout: Some(a.idle_timeout).filter(|t| !t.is_zero()),
        auth_key,
        pg_history: Some(source.pg_history()?),
        temp_changer: Some(std::sync::Arc::new(crate::osd_control::MapTempChanger(
            source.clone(),
        ))),
        scrub: carmine_osd::ScrubSchedule {
            light: Some(a.scrub_interval).filter(|t| !t.is_zero()),
            deep: Some(a.deep_scrub_interval).filter(|t| !t.is_zero()),
        },
        recovery: carmine_osd::RecoveryConfig {
            rate: Some(a.recovery_rate_mib << 20).filter(|r| *r > 0),
            busy_rate: Some(a.recovery_busy_rate_mib << 20).filter(|r| *r > 0),
            max_active: a.recovery_max_active,
            backfill_min_objects: a.backfill_min_objects,
        },
        read_lease: a.read_lease,
        prior_read_lease: Some(prior_read_lease),
        write_ack_wait: carmine_osd::WRITE_ACK_WAIT_DEFAULT,
        lease: lease.clone(),
    })?;
    for (r, (addr, cpu)) in info.reactors.iter().zip(&reactor_cpus).enumerate() {
        let cpu = cpu.map_or("unpinned".to_string(), |c| format!("cpu {c}"));
        println!("osd.{} reactor {r} listening on {addr} ({cpu})", a.id);
    }
    // Metrics are not worth failing the daemon for (a socket path can be too long, say).
    let _perf = a.perf_socket.as_ref().and_then(|p| {
        carmine_reactor::perf::serve_perf_socket(p, osd.reactor_loads())
            .inspect_err(|e| eprintln!("warning: no perf socket at {}: {e}", p.display()))
            .ok()
    });
    let registration = Registration {
        osd: a.id,
        host: carmine_localcluster::host_name(),
        pid: std::process::id(),
        reactors: info.reactors.clone(),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        capacity: capacity(&a, info.reactors.len() as u64),
        pid_ns: carmine_mapstore::membership::pid_namespace(),
        boot_id: carmine_mapstore::membership::boot_id(),
    };
    let mut osd = osd;
    let control = match Control::start(&source, epoch, registration, a.lease_ttl, lease) {
        Ok(c) => c,
        Err(e) => {
            let _ = osd.shutdown();
            return Err(e);
        }
    };
    let _metrics = a.metrics.and_then(|addr| {
        match carmine_osd::serve_metrics(addr, a.id, osd.metrics_sources()) {
            Ok(m) => {
                println!("osd.{} metrics on http://{}/metrics", a.id, m.addr());
                Some(m)
            }
            Err(e) => {
                eprintln!("warning: no metrics on {addr}: {e}");
                None
            }
        }
    });
    println!(
        "osd.{} ready (pid {}), map epoch {epoch} from {}",
        a.id,
        std::process::id(),
        source.describe()
    );
    let stopped = wait_for_stop(signals, &mut osd, &control, a.peer_grace, &map_at_start);
    println!("osd.{} shutting down", a.id);
    control.stop();
    stopped?;
    osd.shutdown()?;
    println!("osd.{} stopped", a.id);
    Ok(())
}

/// The store's size as the OSD registers it (what `osd reweight-by-capacity` sets weights
/// from): the device's length, or the memory budget of all shards.
fn capacity(a: &OsdArgs, reactors: u64) -> u64 {
    match a.store {
        StoreKind::Memory => a.memory_limit.saturating_mul(reactors),
        StoreKind::Native => a
            .device
            .as_ref()
            .and_then(|d| {
                use std::io::Seek;
                // A block device's metadata says 0 bytes; its end says its size.
                std::fs::File::open(d)
                    .ok()?
                    .seek(std::io::SeekFrom::End(0))
                    .ok()
            })
            .unwrap_or(0),
    }
}

/// Checks (or with `--mkfs`, creates) the native store: one shard per reactor.
fn native_store(a: &OsdArgs, reactors: u32) -> Result<StoreConfig> {
    let device = a
        .device
        .clone()
        .context("--device is required with --store native")?;
    // Format only what holds nothing: a missing or empty file, or one of zeros. Anything
    // else without a readable store (a damaged superblock, another program's data) is
    // refused, and left exactly as it is.
    let blank = crate::store::is_blank(&device)
        .with_context(|| format!("inspecting {}", device.display()))?;
    if blank {
        if !a.mkfs {
            bail!(
                "{} holds no native store; pass --mkfs to create one",
                device.display()
            );
        }
        let existed = device.exists();
        let made = crate::store::format(&crate::store::MkfsArgs {
            device: device.clone(),
            shards: reactors,
            size: a.device_size,
            segment_size: carmine_nativestore::DEFAULT_SEGMENT_SIZE as u64,
            force: false,
        });
        if let Err(e) = made {
            // A file this call created and could not finish (a full disk) holds nothing:
            // remove it rather than leave a blank, short store behind.
            if !existed {
                let _ = std::fs::remove_file(&device);
            }
            return Err(e);
        }
    }
    let shards = match crate::store::shard_count(&device) {
        Ok(n) => n,
        // The device itself failed (an I/O error, a filesystem turned read-only): nothing
        // says the store is bad, and formatting is no cure.
        Err(e) if !blank && device_failed(&e) => bail!(
            "{e:#}. The device failed, not the store's format: check {} (nothing on it was \
             changed); the store mounts again once it can be read and written",
            device.display()
        ),
        Err(e) if !blank => bail!(
            "{e:#}. {} holds data but no readable native store: refusing to format it \
             (`carmine store mkfs --force` destroys what it holds)",
            device.display()
        ),
        Err(e) => return Err(e),
    };
    if shards != reactors {
        bail!(
            "the store on {} has {shards} shards but osd.{} runs {reactors} reactors",
            device.display(),
            a.id
        );
    }
    Ok(StoreConfig::Native {
        device,
        config: carmine_nativestore::NativeConfig {
            cache_bytes: a.cache,
            metadata_cache_bytes: a.metadata_cache,
            object_cache_bytes: a.object_cache,
            dirty_metadata_bytes: a.dirty_metadata,
            cleaner_busy_rate_bytes: a.cleaner_rate,
            journal_writes_max: a.journal_writes,
            ..Default::default()
        },
        sync: match a.durability {
            Durability::PowerLoss => carmine_nativestore::SyncMode::Fdatasync,
            Durability::PowerLossDsync => carmine_nativestore::SyncMode::Dsync,
            Durability::ProcessCrash => carmine_nativestore::SyncMode::ProcessCrashOnly,
        },
    })
}

/// Whether `e` comes from the operating system failing an I/O (its errno), rather than from
/// what was read.
fn device_failed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error().is_some())
    })
}

/// Blocks the control thread (never a reactor) until a stop signal arrives. Ten times a
/// second it checks reactor health (a reactor that died takes the daemon down with an
/// error) and hands any newer map epoch to the reactors.
fn wait_for_stop(
    mut signals: signal_hook::iterator::Signals,
    osd: &mut Osd,
    control: &Control,
    peer_grace: Duration,
    first: &OsdMap,
) -> Result<()> {
    // A map that holds this OSD down on its peers' reports: the managers mark it up again
    // only once it says it took that map (decision 0014) — once every reactor serves it, not
    // merely this thread: reactors stuck in the kernel must not vouch for themselves.
    let id = osd.id();
    let hold_in = |m: &OsdMap| {
        m.osd(id)
            .filter(|o| o.down_on_reports())
            .map(|o| (m.epoch, o.held_down_until))
    };
    let mut held_seen = 0;
    let mut hold_pending = hold_in(first);
    loop {
        if let Some((epoch, held)) = hold_pending {
            if osd.applied_epoch() >= epoch {
                held_seen = held_seen.max(held);
                hold_pending = None;
            }
        }
        if signals.pending().next().is_some() {
            return Ok(());
        }
        if osd.any_reactor_exited() {
            bail!("a reactor exited unexpectedly; stopping");
        }
        // A failed store shard stays failed until a restart: its PG copies cannot take a
        // write, and kept running the OSD would be reported, held down and let up again by
        // turns, each time stalling its PGs' clients for a peer grace. Stopping lets the
        // managers mark it down at once and the other copies go on (as Ceph's OSD does).
        if let Some((r, why)) = osd.store_failure() {
            bail!(
                "osd.{id}: the store of reactor {r} failed: {why}. Stopping, so that the other \
                 copies of its PGs serve without it. Check the device; a restart mounts what the \
                 store holds durable (every write it acknowledged)"
            );
        }
        // Another process of this OSD took its registration (it found this one's pid gone,
        // wrongly): this one stops at once, so that never two processes serve one OSD.
        if let Some(why) = control.displaced() {
            bail!("{why}; stopping: another process serves osd.{id} now");
        }
        let silent = osd
            .silent_peers()
            .into_iter()
            .filter(|(_, d)| *d >= peer_grace)
            .collect();
        control.report(silent, held_seen, peer_grace);
        // Waiting on the map channel is the loop's pause: a new epoch reaches the reactors
        // as soon as it arrives.
        for map in control.newer_maps(Duration::from_millis(100)) {
            let me = map.osd(osd.id()).map_or("not in the map".to_string(), |o| {
                format!(
                    "{}, {}",
                    if o.up { "up" } else { "down" },
                    if o.in_ { "in" } else { "out" }
                )
            });
            println!("osd.{}: map epoch {} ({me})", osd.id(), map.epoch);
            if let Some(hold) = hold_in(&map) {
                hold_pending = Some(hold);
            }
            osd.apply_map(map)?;
        }
    }
}

/// A read lease between 100 ms (pings every quarter of it must get through a loaded reactor)
/// and 60 s (a failover may wait that long for the old primary's lease to run out).
/// A `--read-lease`: at least 100 ms, at most `READ_LEASE_MAX`.
fn parse_read_lease(s: &str) -> Result<Duration, String> {
    let d = crate::nbd::parse_duration(s)?;
    if d < Duration::from_millis(100) || d > READ_LEASE_MAX {
        return Err(format!(
            "a read lease of {d:?}: give one between 100ms and 60s (without a lease, no PG of \
             more than one copy could serve a read)"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reactors_poll_by_default_only_on_cores_of_their_own() {
        assert_eq!(idle_poll(None, true).0, IDLE_POLL_OWN_CORE);
        assert_eq!(idle_poll(None, false).0, Duration::ZERO);
        // Given, it is taken as it is, shared cores or not.
        assert_eq!(idle_poll(Some(0), true).0, Duration::ZERO);
        assert_eq!(idle_poll(Some(200), false).0, Duration::from_micros(200));
    }
}
