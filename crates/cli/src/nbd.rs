//! `carmine nbd serve`: the NBD gateway in the foreground.

use crate::volume::Target;
use anyhow::{Context, Result};
use carmine_client::{ClientConfig, SharedInstance};
use carmine_localcluster::connect_with;
use carmine_nbd::{Export, NbdConfig, Spread};
use carmine_volume::{LockOptions, LockShare, Volumes};
use clap::{Args, Subcommand};
use futures::future::Either;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Subcommand)]
pub enum NbdCommand {
    /// Export volumes over NBD until SIGTERM/SIGINT (acknowledged writes are already stored;
    /// the volume locks are handed back).
    Serve(ServeArgs),
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Volumes to export, by name (the export name is the volume name). Repeat or comma-separate.
    #[arg(long = "export", required = true, value_delimiter = ',')]
    pub exports: Vec<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: SocketAddr,
    /// Also listen on this Unix-domain socket (clients: nbd+unix:///NAME?socket=PATH).
    #[arg(long)]
    pub unix: Option<std::path::PathBuf>,
    /// Refuse writes, trims and zeroing on every export.
    #[arg(long)]
    pub read_only: bool,
    /// Requests per connection executing at once.
    #[arg(long, default_value_t = 256)]
    pub inflight_max: usize,
    /// Bytes one connection may hold in requests executing and replies unsent (e.g. 64M);
    /// beyond it the gateway stops reading that client's requests.
    #[arg(long, default_value = "64M", value_parser = crate::size::parse_size)]
    pub connection_bytes_max: u64,
    /// Open NBD connections at once; more are refused.
    #[arg(long, default_value_t = 1024)]
    pub connections_max: usize,
    /// Drop a client that sends nothing for this long while none of its requests is executing
    /// or unanswered: seconds, or "10m". 0 (the default) never does: the kernel and QEMU keep
    /// idle connections for hours. Clients stalled half way through a request, or not taking
    /// their replies, are dropped after 30 s regardless.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// How long a request waits for an unreachable OSD (e.g. one restarting) before the NBD
    /// client gets EIO: "30s", "500ms", or seconds. Until then the client sees a stall.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub retry_timeout: Duration,
    /// Lease of each writable export's exclusive volume lock ("10s", "500ms"): renewed every
    /// third of it; after a gateway dies, the next one waits this long before it takes over.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lock_lease: Duration,
    /// Microseconds the gateway's reactor keeps polling for work before it sleeps (0: sleep
    /// at once): lower latency at low queue depth, for a gateway with a core of its own.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub idle_poll_us: u64,
    /// Reactor threads serving NBD connections, each with its own cluster connections;
    /// connections are spread over them in turn. They all write as one client under each
    /// volume's one lock.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub reactors: u8,
    /// Cores to pin the reactors to, e.g. "0" or "2-3" (reactor i on the i-th, in turn).
    /// Unpinned by default.
    #[arg(long)]
    pub cpu_set: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

pub fn run(cmd: NbdCommand) -> Result<()> {
    let NbdCommand::Serve(a) = cmd;
    carmine_reactor::set_idle_poll(Duration::from_micros(a.idle_poll_us));
    let cpus = match &a.cpu_set {
        Some(list) => carmine_reactor::cpu::parse_cpu_list(list).context("--cpu-set")?,
        None => Vec::new(),
    };
    if !cpus.is_empty() && cpus.len() < usize::from(a.reactors) {
        // Measured: two reactors on one core with fio beside them collapse at depth 64
        // (17-23K IOPS instead of 78K), each waking the other for a few requests at a time.
        eprintln!(
            "nbd: WARNING: {} reactors on {} core(s): reactors sharing a core preempt each \
             other and serve less than one reactor would",
            a.reactors,
            cpus.len()
        );
    }
    let cpu_of = move |i: usize| (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
    if let Some(cpu) = cpu_of(0) {
        carmine_reactor::cpu::pin_current_thread(cpu)
            .with_context(|| format!("pinning the gateway to cpu {cpu}"))?;
    }
    carmine_reactor::block_on(serve(a, cpu_of))
}

/// What a reactor thread other than the first needs to serve the same exports.
struct ReactorSetup {
    lane: u8,
    instance: u64,
    target: Target,
    client: ClientConfig,
    /// Each export's name and the share of its lock (`None`: read-only).
    exports: Vec<(String, Option<LockShare>)>,
    nbd: NbdConfig,
    stop: Arc<AtomicBool>,
}

async fn serve(a: ServeArgs, cpu_of: impl Fn(usize) -> Option<u32>) -> Result<()> {
    let client_cfg = ClientConfig {
        retry_timeout: a.retry_timeout,
        ..ClientConfig::default()
    };
    let client = connect_with(&a.target.dir.dir, client_cfg.clone()).await?;
    let pool = client.pool_id(&a.target.pool)?;
    let instance = client.instance();
    let volumes = Volumes::new(client, pool);
    let mut exports = Vec::with_capacity(a.exports.len());
    for name in &a.exports {
        // A writable export holds the volume's exclusive lock: one writer per volume.
        let lock = LockOptions {
            lease: a.lock_lease,
            holder: format!(
                "carmine nbd serve on {} (pid {})",
                a.listen,
                std::process::id()
            ),
        };
        let image = if a.read_only {
            volumes.open_read_only(name).await
        } else {
            volumes.open_with(name, &lock).await
        }
        .with_context(|| format!("opening volume {name:?}"))?;
        exports.push(Export {
            name: name.clone(),
            image,
            read_only: a.read_only,
        });
    }
    let std_listener = std::net::TcpListener::bind(a.listen)
        .with_context(|| format!("listening on {}", a.listen))?;
    std_listener.set_nonblocking(true)?;
    let listener = carmine_reactor::TcpListener::from_std(std_listener)?;
    let exports = Rc::new(exports);
    let cfg = NbdConfig {
        inflight_max: a.inflight_max,
        connection_bytes_max: usize::try_from(a.connection_bytes_max)
            .context("--connection-bytes-max")?,
        connections_max: a.connections_max,
        idle_timeout: Some(a.idle_timeout).filter(|t| !t.is_zero()),
        ..NbdConfig::default()
    };
    // SIGTERM/SIGINT: stop serving and hand the volume locks back, so the next gateway
    // need not wait out the lease.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    // The other reactors, each ready (connected, its exports open) before any connection
    // is handed to it.
    let mut mailboxes = Vec::new();
    let mut reactors = Vec::new();
    for lane in 1..a.reactors {
        let setup = ReactorSetup {
            lane,
            instance,
            target: a.target.clone(),
            client: client_cfg.clone(),
            exports: exports
                .iter()
                .map(|e| (e.name.clone(), e.image.lock_share()))
                .collect(),
            nbd: cfg.clone(),
            stop: stop.clone(),
        };
        let (tx, rx) = carmine_reactor::mailbox(HANDOFF_QUEUE);
        let (ready_tx, ready_rx) = futures::channel::oneshot::channel();
        let started = carmine_reactor::spawn_reactor(
            format!("nbd-{lane}"),
            cpu_of(usize::from(lane)),
            move || serve_handed(setup, rx, ready_tx),
        )
        .with_context(|| format!("starting reactor {lane}"));
        let ready = match started {
            Ok(handle) => {
                reactors.push(handle);
                match ready_rx.await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e.context(format!("starting reactor {lane}"))),
                    Err(_) => Err(anyhow::anyhow!("reactor {lane} ended while starting")),
                }
            }
            Err(e) => Err(e),
        };
        if let Err(e) = ready {
            // The locks taken so far go back now rather than after their lease.
            stop.store(true, Ordering::Relaxed);
            wait_for(&reactors).await;
            let release = release_locks(&volumes, &exports, &a.target, a.retry_timeout);
            if let Ok(Err(r)) = carmine_reactor::timeout(RELEASE_TIMEOUT, release).await {
                eprintln!("nbd: locks left to expire after their lease: {r:#}");
            }
            return Err(e);
        }
        mailboxes.push(tx);
    }
    let spread = Spread::over(mailboxes);
    let mode = if a.read_only {
        "read-only"
    } else {
        "read-write"
    };
    if !a.read_only {
        println!(
            "nbd: holding the exclusive lock of {} (lease {:?}); other writers are refused",
            a.exports.join(", "),
            a.lock_lease
        );
    }
    println!(
        "nbd: serving {} on nbd://{}/ ({mode}, {} reactor{})",
        a.exports.join(", "),
        a.listen,
        a.reactors,
        if a.reactors == 1 { "" } else { "s" }
    );
    if carmine_localcluster::store_kind(&a.target.dir.dir).as_deref() == Some("memory") {
        println!(
            "nbd: WARNING: this cluster keeps its data in memory (store `memory`): \
             flush and FUA complete, but nothing survives an OSD restart"
        );
    }
    if let Some(path) = &a.unix {
        remove_stale_socket(path)?;
        let unix = carmine_reactor::UnixListener::bind(path)
            .await
            .with_context(|| format!("listening on {}", path.display()))?;
        println!("nbd: serving on nbd+unix:///?socket={}", path.display());
        let (exports, cfg, spread) = (exports.clone(), cfg.clone(), spread.clone());
        carmine_reactor::spawn(async move {
            if let Err(e) = carmine_nbd::serve_unix(unix, exports, cfg, spread).await {
                eprintln!("nbd: unix socket listener failed: {e}");
            }
        })
        .detach();
    }
    let serving = std::pin::pin!(carmine_nbd::serve(
        listener,
        exports.clone(),
        cfg,
        spread.clone()
    ));
    // A reactor that ends on its own (a panic) would keep its share of the connections
    // counted and get every Nth new one: the gateway stops instead, handing its locks back.
    let stopping = std::pin::pin!(async {
        while !stop.load(Ordering::Relaxed) {
            if let Some(r) = reactors.iter().find(|r| r.is_finished()) {
                return Err(anyhow::anyhow!("reactor {} ended unexpectedly", r.name));
            }
            carmine_reactor::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    });
    let served = match futures::future::select(serving, stopping).await {
        Either::Left((res, _)) => res.map_err(anyhow::Error::from),
        Either::Right((res, _)) => res,
    };
    // The other reactors stop serving (their connections close) before the locks go back.
    stop.store(true, Ordering::Relaxed);
    wait_for(&reactors).await;
    let per_reactor = spread.served();
    if per_reactor.len() > 1 {
        let counts: Vec<String> = per_reactor.iter().map(u64::to_string).collect();
        println!("nbd: connections per reactor: {}", counts.join(", "));
    }
    let release = release_locks(&volumes, &exports, &a.target, a.retry_timeout);
    match carmine_reactor::timeout(RELEASE_TIMEOUT, release).await {
        Ok(Ok(names)) if names.is_empty() => println!("nbd: stopped"),
        Ok(Ok(names)) => println!("nbd: stopped; released the lock of {}", names.join(", ")),
        Ok(Err(e)) => println!("nbd: stopped; locks left to expire after their lease: {e:#}"),
        Err(_) => println!(
            "nbd: stopped; releasing the locks took over {RELEASE_TIMEOUT:?}, they expire \
             after their lease"
        ),
    }
    served
}

/// Waits (a bounded time) for the other reactors to finish once told to stop.
async fn wait_for(reactors: &[carmine_reactor::ReactorHandle<()>]) {
    let deadline = std::time::Instant::now() + RELEASE_TIMEOUT;
    while reactors.iter().any(|r| !r.is_finished()) && std::time::Instant::now() < deadline {
        carmine_reactor::sleep(Duration::from_millis(20)).await;
    }
}

/// Connections waiting to be taken by one reactor; the acceptor waits beyond it.
const HANDOFF_QUEUE: usize = 64;

async fn until(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        carmine_reactor::sleep(Duration::from_millis(50)).await;
    }
}

/// One reactor other than the first: its own client, speaking as the first's client
/// instance in a lane of its own, the exports opened under the first's locks, then the
/// connections handed to it until the gateway stops.
async fn serve_handed(
    setup: ReactorSetup,
    handed: carmine_reactor::Mailbox<carmine_nbd::Accepted>,
    ready: futures::channel::oneshot::Sender<Result<()>>,
) {
    let opened = async {
        let cfg = ClientConfig {
            instance: Some(SharedInstance {
                id: setup.instance,
                lane: setup.lane,
            }),
            ..setup.client.clone()
        };
        let client = connect_with(&setup.target.dir.dir, cfg).await?;
        let pool = client.pool_id(&setup.target.pool)?;
        let volumes = Volumes::new(client, pool);
        let mut exports = Vec::with_capacity(setup.exports.len());
        for (name, share) in &setup.exports {
            let image = match share {
                Some(share) => volumes.open_shared(name, share.clone()).await,
                None => volumes.open_read_only(name).await,
            }
            .with_context(|| format!("opening volume {name:?}"))?;
            exports.push(Export {
                name: name.clone(),
                image,
                read_only: share.is_none(),
            });
        }
        anyhow::Ok(exports)
    };
    let exports = match opened.await {
        Ok(e) => e,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if ready.send(Ok(())).is_err() {
        return;
    }
    let serving = std::pin::pin!(carmine_nbd::serve_handed(
        handed,
        Rc::new(exports),
        setup.nbd
    ));
    futures::future::select(serving, std::pin::pin!(until(&setup.stop))).await;
}

/// How long a stopping gateway tries to hand its locks back before it leaves them to expire.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// Hands back the locks of the writable exports. Requests of ours may still be on their way to
/// an OSD (their NBD connections were just dropped), so a plain release could let one land
/// after the next holder's writes: fence this gateway's own client first (the fence returns
/// once nothing of ours can still apply), then remove the lock records from a new client.
async fn release_locks(
    volumes: &Volumes,
    exports: &[Export],
    target: &Target,
    retry_timeout: Duration,
) -> Result<Vec<String>> {
    let held: Vec<(String, bytes::Bytes)> = exports
        .iter()
        .filter_map(|e| Some((e.name.clone(), e.image.lock_record()?)))
        .collect();
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let client = volumes.client();
    // The fence goes to the OSDs of the newest map: another reactor may have written to an
    // OSD this reactor's older map does not name yet.
    client
        .refresh_map()
        .await
        .context("fetching the map to fence by")?;
    client
        .fence(client.instance())
        .await
        .context("fencing this gateway's own requests")?;
    let cfg = ClientConfig {
        retry_timeout,
        ..ClientConfig::default()
    };
    let fresh = connect_with(&target.dir.dir, cfg).await?;
    let pool = fresh.pool_id(&target.pool)?;
    let releaser = Volumes::new(fresh, pool);
    let mut released = Vec::new();
    for (name, record) in held {
        if releaser.release_lock_record(&name, record).await? {
            released.push(name);
        }
    }
    Ok(released)
}

/// A socket file left by an earlier gateway would make bind fail; anything else at that path
/// is not ours to remove.
fn remove_stale_socket(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => Ok(std::fs::remove_file(path)?),
        Ok(_) => anyhow::bail!("{} exists and is not a socket", path.display()),
        Err(_) => Ok(()),
    }
}

/// Parses "30s", "500ms", "2m" or plain seconds ("1.5").
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (e.g. 30s, 500ms)"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(format!("unknown unit in {s:?} (use ms, s, m, h or d)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_with_and_without_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
