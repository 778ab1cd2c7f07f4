//! Bringing an OSD up and down: binding endpoints, starting pinned reactors, shutdown.

use crate::reactor::{run_reactor, ControlMsg, ReactorSetup};
use carmine_cluster::OsdMap;
use carmine_reactor::{mailbox, spawn_reactor_in, MailboxSender, ReactorHandle};
use carmine_types::OsdId;
use std::net::TcpListener as StdTcpListener;
use thiserror::Error;

/// Which store each reactor shard runs.
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// In-memory shards, each limited to `memory_limit_bytes`.
    Memory { memory_limit_bytes: u64 },
    /// The native store on a formatted device; reactor `i` mounts shard `i`.
    Native {
        device: std::path::PathBuf,
        config: carmine_nativestore::NativeConfig,
        sync: carmine_nativestore::SyncMode,
    },
}

#[derive(Clone, Debug)]
pub struct OsdConfig {
    pub id: OsdId,
    pub map: OsdMap,
    /// CPU for each reactor (`None` leaves it unpinned); its length must match the map.
    pub reactor_cpus: Vec<Option<u32>>,
    pub store: StoreConfig,
    /// Open connections per reactor; more are refused. Each connection may hold a few MiB of
    /// buffers, so this bounds a reactor's connection memory.
    pub connections_max: u32,
    /// A connection that makes no progress for this long is closed, if the peer is to blame:
    /// nothing in flight and nothing unsent (idle, or stalled half way through a frame), or
    /// replies it does not take. Requests waiting on the store never time out. `None`: never.
    pub idle_timeout: Option<std::time::Duration>,
    /// The cluster key: every connection must complete the handshake with it before any
    /// request is read. `None` serves without authentication.
    pub auth_key: Option<carmine_proto::auth::AuthKey>,
    /// Where PGs' histories are recorded (the map store). Required for pools of more than one
    /// copy: without it their PGs never peer and take no requests.
    pub pg_history: Option<crate::SharedHistoryStore>,
    /// How a primary changes its PG's temporary acting set in the map (decision 0015): sets
    /// one when members of its acting set lack most of the PG, removes it once it filled the
    /// PG's backfill targets. `None`: the PGs keep what others set.
    pub temp_changer: Option<crate::TempChanger>,
    /// When replicated PGs are scrubbed on their own.
    pub scrub: crate::ScrubSchedule,
    /// How fast replicated PGs recover in the background.
    pub recovery: crate::RecoveryConfig,
    /// The read lease the members of replicated PGs grant their primaries: a primary cut off
    /// from its replicas stops serving reads within it, and a new primary waits out what its
    /// members granted before it goes active ([`crate::READ_LEASE_DEFAULT`]).
    pub read_lease: std::time::Duration,
    /// The longest read lease this OSD's earlier runs may still have promises under (`None`:
    /// `read_lease`): a restarted OSD takes them to run that long past its start.
    pub prior_read_lease: Option<std::time::Duration>,
    /// How long a replicated write waits for all its copies before its client hears it is in
    /// doubt and retries ([`crate::WRITE_ACK_WAIT_DEFAULT`]).
    pub write_ack_wait: std::time::Duration,
    /// The OSD's lease in etcd, as its renewals go: clients are refused once it may have run
    /// out (see `lease`). `None`: no lease (a map file), never refused for it.
    pub lease: Option<std::sync::Arc<crate::LeaseClock>>,
}

impl OsdConfig {
    /// OSD `id` of `map` with the memory store (`memory_limit_bytes` per reactor), unpinned,
    /// and every other setting at its default: no key, no map store for PG histories, no
    /// etcd lease. What embedded OSDs and tests start from (`OsdConfig { .., ..this }`).
    pub fn in_memory(id: OsdId, map: OsdMap, memory_limit_bytes: u64) -> Self {
        let reactors = map.osd(id).map_or(1, |o| o.reactors.len());
        OsdConfig {
            id,
            map,
            reactor_cpus: vec![None; reactors],
            store: StoreConfig::Memory { memory_limit_bytes },
            connections_max: CONNECTIONS_MAX_DEFAULT,
            idle_timeout: Some(IDLE_TIMEOUT_DEFAULT),
            auth_key: None,
            pg_history: None,
            temp_changer: None,
            scrub: Default::default(),
            recovery: Default::default(),
            read_lease: crate::READ_LEASE_DEFAULT,
            prior_read_lease: None,
            write_ack_wait: crate::WRITE_ACK_WAIT_DEFAULT,
            lease: None,
        }
    }
}

/// Default for [`OsdConfig::connections_max`].
pub const CONNECTIONS_MAX_DEFAULT: u32 = 1024;

/// Default for [`OsdConfig::idle_timeout`]: ten minutes. Clients keep one connection per
/// reactor and reopen it on their next request.
pub const IDLE_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(600);

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OsdError {
    #[error("osd.{0} is not in the cluster map")]
    NotInMap(OsdId),
    #[error("osd.{id}: the map lists {in_map} reactors but {configured} CPUs were configured")]
    ReactorCount {
        id: OsdId,
        in_map: usize,
        configured: usize,
    },
    #[error("osd.{id} reactor {reactor}: cannot listen on {addr}: {source}")]
    Bind {
        id: OsdId,
        reactor: usize,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("osd.{id}: cannot use the store device {}: {source}", device.display())]
    Device {
        id: OsdId,
        device: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("osd.{id}: cannot start reactor thread: {source}")]
    Spawn { id: OsdId, source: std::io::Error },
    #[error("osd.{id}: reactor {reactor} failed: {detail}")]
    Reactor {
        id: OsdId,
        reactor: usize,
        detail: String,
    },
}

/// How long a starting OSD waits for its port to be released: an OSD killed a moment ago
/// with io_uring operations pending (an accept) keeps its listening socket until the kernel
/// tears its ring down, shortly after the process is gone.
const PORT_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn bind_when_released(addr: std::net::SocketAddr) -> std::io::Result<StdTcpListener> {
    let deadline = std::time::Instant::now() + PORT_RELEASE_WAIT;
    loop {
        match StdTcpListener::bind(addr) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            result => return result,
        }
    }
}

/// A reactor thread's result: `Err` carries why it stopped serving.
type ReactorResult = Result<(), String>;

/// A running OSD. Dropping it without `shutdown` leaves the reactors running.
pub struct Osd {
    id: OsdId,
    epoch: u32,
    metrics: Vec<std::sync::Arc<crate::metrics::ReactorMetrics>>,
    /// The native store's device lock, held for the daemon's life.
    _device_lock: Option<carmine_nativestore::DeviceLock>,
    reactors: Vec<(MailboxSender<ControlMsg>, ReactorHandle<ReactorResult>)>,
}

/// Undelivered control messages per reactor; control traffic is rare.
const CONTROL_MAILBOX_CAPACITY: usize = 4;

impl Osd {
    /// Binds every reactor's endpoint (so address conflicts are reported here, synchronously),
    /// then starts the reactors. Returns once all are listening.
    pub fn start(cfg: OsdConfig) -> Result<Osd, OsdError> {
        let info = cfg
            .map
            .osd(cfg.id)
            .ok_or(OsdError::NotInMap(cfg.id))?
            .clone();
        if info.reactors.len() != cfg.reactor_cpus.len() {
            return Err(OsdError::ReactorCount {
                id: cfg.id,
                in_map: info.reactors.len(),
                configured: cfg.reactor_cpus.len(),
            });
        }
        let device_lock = match &cfg.store {
            StoreConfig::Native { device, .. } => Some(
                carmine_nativestore::DeviceLock::acquire(device).map_err(|source| {
                    OsdError::Device {
                        id: cfg.id,
                        device: device.clone(),
                        source,
                    }
                })?,
            ),
            StoreConfig::Memory { .. } => None,
        };
        let mut listeners = Vec::with_capacity(info.reactors.len());
        for (reactor, addr) in info.reactors.iter().enumerate() {
            let l = bind_when_released(*addr)
                .and_then(|l| l.set_nonblocking(true).map(|_| l))
                .map_err(|source| OsdError::Bind {
                    id: cfg.id,
                    reactor,
                    addr: *addr,
                    source,
                })?;
            listeners.push(l);
        }
        let map = std::sync::Arc::new(cfg.map.clone());
        // One mailbox per reactor for the map store's answers, one worker making the calls.
        let mut answers = Vec::new();
        let mut history_clients = Vec::new();
        if let Some(store) = &cfg.pg_history {
            let mut senders = Vec::new();
            for _ in 0..listeners.len() {
                let (tx, rx) = mailbox(crate::replication::history::ANSWERS);
                senders.push(tx);
                answers.push(rx);
            }
            history_clients = crate::replication::history::start(
                store.clone(),
                cfg.temp_changer.clone(),
                senders,
            )
            .map_err(|source| OsdError::Spawn { id: cfg.id, source })?;
        }
        let mut answers = answers.into_iter();
        let mut history_clients = history_clients.into_iter();
        let mut reactors = Vec::with_capacity(listeners.len());
        let mut reactor_metrics = Vec::with_capacity(listeners.len());
        for (index, (listener, cpu)) in listeners
            .into_iter()
            .zip(cfg.reactor_cpus.iter().copied())
            .enumerate()
        {
            let (tx, rx) = mailbox(CONTROL_MAILBOX_CAPACITY);
            let metrics = std::sync::Arc::new(crate::metrics::ReactorMetrics::default());
            reactor_metrics.push(metrics.clone());
            let setup = ReactorSetup {
                osd: cfg.id,
                index: index as u32,
                map: map.clone(),
                store: cfg.store.clone(),
                listener,
                control: rx,
                connections_max: cfg.connections_max as u64,
                idle_timeout: cfg.idle_timeout,
                metrics,
                auth_key: cfg.auth_key.clone(),
                history: history_clients.next().zip(answers.next()),
                scrub: cfg.scrub,
                recovery: cfg.recovery,
                read_lease: cfg.read_lease,
                prior_read_lease: cfg.prior_read_lease.unwrap_or(cfg.read_lease),
                write_ack_wait: cfg.write_ack_wait,
                lease: cfg.lease.clone(),
            };
            let name = format!("osd{}-r{}", cfg.id, index);
            // Every log line of the reactor says which OSD and reactor it is about (the
            // epoch is in the events that change it: a span field recorded again would be
            // printed twice by the fmt layer).
            let span = tracing::info_span!("reactor", osd = cfg.id, reactor = index);
            let handle = spawn_reactor_in(span, name, cpu, move || async move {
                let result = run_reactor(setup).await;
                // Said at once: the control thread notices only on its next check.
                if let Err(e) = &result {
                    tracing::error!("reactor stopped: {e}");
                }
                result
            })
            .map_err(|source| OsdError::Spawn { id: cfg.id, source })?;
            reactors.push((tx, handle));
        }
        Ok(Osd {
            id: cfg.id,
            epoch: cfg.map.epoch,
            metrics: reactor_metrics,
            _device_lock: device_lock,
            reactors,
        })
    }

    pub fn id(&self) -> OsdId {
        self.id
    }

    /// The newest map epoch handed to the reactors.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Hands a newer map to every reactor (an older or equal one is ignored). Each switches to
    /// it on its own, after creating the collections of the PGs it gains. Blocks while a
    /// reactor's control mailbox is full.
    pub fn apply_map(&mut self, map: OsdMap) -> Result<(), OsdError> {
        if map.epoch <= self.epoch {
            return Ok(());
        }
        let Some(me) = map.osd(self.id) else {
            return Err(OsdError::NotInMap(self.id));
        };
        if me.reactors.len() != self.reactors.len() {
            return Err(OsdError::ReactorCount {
                id: self.id,
                in_map: me.reactors.len(),
                configured: self.reactors.len(),
            });
        }
        self.epoch = map.epoch;
        let map = std::sync::Arc::new(map);
        for (reactor, (tx, _)) in self.reactors.iter_mut().enumerate() {
            tx.send_blocking(ControlMsg::Map(map.clone()))
                .map_err(|_| OsdError::Reactor {
                    id: self.id,
                    reactor,
                    detail: "stopped before taking the new map".into(),
                })?;
        }
        Ok(())
    }

    /// Asks every reactor to stop accepting, close its connections and exit, then waits.
    pub fn shutdown(self) -> Result<(), OsdError> {
        let id = self.id;
        let mut handles = Vec::new();
        for (mut tx, handle) in self.reactors {
            let _ = tx.send_blocking(ControlMsg::Shutdown);
            handles.push(handle);
        }
        let mut first_err = None;
        for (reactor, h) in handles.into_iter().enumerate() {
            let res = h.join().map_err(|e| e.to_string()).and_then(|r| r);
            if let Err(detail) = res {
                first_err.get_or_insert(OsdError::Reactor {
                    id,
                    reactor,
                    detail,
                });
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Each reactor's name and load counters (for the perf socket).
    pub fn reactor_loads(&self) -> Vec<(String, std::sync::Arc<carmine_reactor::ReactorLoad>)> {
        self.reactors
            .iter()
            .map(|(_, h)| (h.name.clone(), h.load.clone()))
            .collect()
    }

    /// Each reactor's counters and load, for the metrics endpoint.
    pub fn metrics_sources(&self) -> Vec<crate::metrics::ReactorSource> {
        self.metrics
            .iter()
            .zip(&self.reactors)
            .enumerate()
            .map(|(index, (m, (_, h)))| crate::metrics::ReactorSource {
                index,
                metrics: m.clone(),
                load: h.load.clone(),
            })
            .collect()
    }

    /// Other OSDs that this OSD's PGs wait on without hearing from them, each with the longest
    /// silence any reactor saw (see `carmine_pg::Member::unresponsive`): what the control
    /// thread reports to the managers once it outlasts the peer grace.
    pub fn silent_peers(&self) -> std::collections::BTreeMap<OsdId, std::time::Duration> {
        let mut all = std::collections::BTreeMap::new();
        for m in &self.metrics {
            for (o, ns) in m.silent_peers() {
                let d = std::time::Duration::from_nanos(ns);
                let s = all.entry(o).or_insert(d);
                *s = (*s).max(d);
            }
        }
        all
    }

    /// The first reactor whose store shard failed, and why (see `ReactorMetrics`).
    pub fn store_failure(&self) -> Option<(usize, String)> {
        self.metrics
            .iter()
            .enumerate()
            .find_map(|(r, m)| Some((r, m.store_failure()?.to_string())))
    }

    /// The oldest map epoch any reactor serves: every reactor has switched to it.
    pub fn applied_epoch(&self) -> u32 {
        self.metrics.iter().map(|m| m.epoch()).min().unwrap_or(0)
    }

    /// True once any reactor has stopped on its own (a failure: reactors run until shutdown).
    pub fn any_reactor_exited(&self) -> bool {
        self.reactors.iter().any(|(_, h)| h.is_finished())
    }
}
