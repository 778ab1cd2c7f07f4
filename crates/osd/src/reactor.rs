//! One reactor: accepts connections on its endpoint and serves the PGs it owns from its own
//! store shard. Everything here runs on a single pinned thread; shared state is `Rc`.

use crate::daemon::StoreConfig;
use crate::handler::{handle_frame, Sender};
use bytes::BytesMut;
use carmine_cluster::OsdMap;
use carmine_nativestore::{FileDevice, NativeStore};
use carmine_proto::peer_parts::{self, Assembly};
use carmine_proto::try_decode_frame;
use carmine_reactor::io::{read_some, write_all_noting};
use carmine_reactor::{Mailbox, TcpListener, TcpStream, Watchdog};
use carmine_store::{MemStore, MemStoreConfig, ObjectStore, Transaction};
use carmine_types::{OsdId, PgId};
use futures::future::LocalBoxFuture;
use futures::future::{select, Either};
use futures::stream::{FuturesUnordered, StreamExt};
use std::cell::Cell;
use std::cell::RefCell;
use std::collections::HashSet;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// Messages from the control thread to a reactor.
#[derive(Debug)]
pub enum ControlMsg {
    Shutdown,
    /// A newer cluster map: serve the PGs this reactor owns in it from now on.
    Map(Arc<OsdMap>),
}

pub(crate) struct ReactorSetup {
    pub osd: OsdId,
    pub index: u32,
    pub map: Arc<OsdMap>,
    pub store: StoreConfig,
    pub listener: std::net::TcpListener,
    pub control: Mailbox<ControlMsg>,
    pub connections_max: u64,
    pub idle_timeout: Option<Duration>,
    pub metrics: Arc<crate::metrics::ReactorMetrics>,
    pub auth_key: Option<carmine_proto::auth::AuthKey>,
    /// The map store's PG histories (through the OSD's worker thread) and this reactor's
    /// mailbox for its answers; `None` if the OSD has no map store (one-copy pools only).
    pub history: Option<(
        crate::replication::history::HistoryClient,
        Mailbox<crate::replication::history::Answer>,
    )>,
    pub scrub: crate::ScrubSchedule,
    pub recovery: crate::RecoveryConfig,
    pub read_lease: std::time::Duration,
    pub prior_read_lease: std::time::Duration,
    pub write_ack_wait: std::time::Duration,
    pub lease: Option<Arc<crate::LeaseClock>>,
}

/// Everything one reactor owns.
pub(crate) struct Shard<S> {
    pub osd: OsdId,
    pub index: u32,
    /// The map epoch it serves by; replaced whole when a newer one arrives, never borrowed
    /// across an await.
    pub view: RefCell<Rc<MapView>>,
    pub store: S,
    pub connections: Cell<u64>,
    pub fences: crate::fence::Fences,
    pub metrics: Arc<crate::metrics::ReactorMetrics>,
    /// The cluster key every connection must prove it holds (`None`: no authentication).
    pub auth_key: Option<carmine_proto::auth::AuthKey>,
    /// Connections still in the handshake (bounded by `HANDSHAKES_MAX`).
    pub handshaking: Cell<u32>,
    /// The line of requests waiting for a newer map epoch (see `handler::caught_up`).
    pub epoch_line: carmine_reactor::FifoLock,
    /// See `OsdConfig::idle_timeout`.
    pub idle_timeout: Option<Duration>,
    /// The PGs of pools with more than one copy that this reactor holds a copy of.
    pub replication: crate::replication::Replication,
    /// See `OsdConfig::lease`.
    pub lease: Option<Arc<crate::LeaseClock>>,
    /// Deleting what this store holds of removed pools (see `removed_pools`).
    pub removed_pools: crate::removed_pools::Sweeps,
    /// This shard itself, for the tasks its requests spawn.
    pub me: std::rc::Weak<Shard<S>>,
}

impl<S> Shard<S> {
    /// The shard as its tasks hold it (it lives as long as the reactor).
    pub fn rc(&self) -> Rc<Shard<S>> {
        self.me.upgrade().expect("the shard outlives its requests")
    }
}

/// Connections per reactor that may be in the handshake at once: a peer that proves nothing
/// cannot take the slots of real clients (`connections_max`) for the handshake's timeout.
const HANDSHAKES_MAX: u32 = 64;
/// How often a reactor refreshes its store's space figures in its metrics.
const STATFS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Counts a connection as handshaking until dropped (also if its task is dropped midway).
struct Handshaking<'a>(&'a Cell<u32>);

impl<'a> Handshaking<'a> {
    fn new(c: &'a Cell<u32>) -> Self {
        c.set(c.get() + 1);
        Handshaking(c)
    }
}

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// One map epoch as a reactor uses it.
pub(crate) struct MapView {
    pub map: Arc<OsdMap>,
    pub encoded: bytes::Bytes,
    /// The PGs whose primary is this reactor in `map`.
    pub owned: HashSet<PgId>,
    /// Some pool keeps more than one copy.
    pub replicated: bool,
}

impl MapView {
    fn new(map: Arc<OsdMap>, osd: OsdId, reactor: u32) -> Self {
        MapView {
            encoded: map.encode(),
            owned: map.pgs_of_reactor(osd, reactor).into_iter().collect(),
            replicated: map.pools.iter().any(|p| p.size > 1),
            map,
        }
    }
}

/// Creates the collections of the PGs `view` gives this reactor that its store lacks (a
/// persistent store keeps those it served before a restart or before they moved away).
async fn create_collections<S: ObjectStore>(store: &S, view: &MapView) -> Result<(), String> {
    let existing = store
        .list_collections()
        .await
        .map_err(|e| format!("listing PG collections: {e}"))?;
    let mut txn = Transaction::with_capacity(view.owned.len() + 1);
    for pg in view.owned.iter().filter(|pg| !existing.contains(pg)) {
        txn.create_collection(*pg);
    }
    if !existing.contains(&crate::fence::META_COLLECTION) {
        txn.create_collection(crate::fence::META_COLLECTION);
    }
    if txn.is_empty() {
        return Ok(());
    }
    store
        .submit(txn)
        .await
        .map_err(|e| format!("creating PG collections: {e}"))
}

/// Receive buffer room for a peer that fills its reads: one read can pull in many pipelined
/// requests.
const READ_SPARE_MAX: usize = 256 * 1024;
/// Receive buffer room for a peer that does not: ten thousand idle connections hold this much
/// each, not a quarter MiB that the allocator may hand out already touched (resident).
const READ_SPARE_SMALL: usize = 16 * 1024;
/// Replies are flushed once this much is pending, even if more requests are buffered, to
/// bound per-connection memory.
const WRITE_FLUSH_BYTES: usize = 1024 * 1024;

pub(crate) async fn run_reactor(setup: ReactorSetup) -> Result<(), String> {
    match setup.store.clone() {
        StoreConfig::Memory { memory_limit_bytes } => {
            let store = MemStore::new(MemStoreConfig { memory_limit_bytes });
            serve(setup, store).await
        }
        StoreConfig::Native {
            device,
            config,
            sync,
        } => {
            let dev = FileDevice::open(&device, sync)
                .await
                .map_err(|e| format!("opening {}: {e}", device.display()))?;
            let store = NativeStore::mount(dev, setup.index, config)
                .await
                .map_err(|e| {
                    format!(
                        "mounting shard {} of {}: {e}",
                        setup.index,
                        device.display()
                    )
                })?;
            serve(setup, store).await
        }
    }
}

async fn serve<S: ObjectStore + 'static>(setup: ReactorSetup, store: S) -> Result<(), String> {
    let ReactorSetup {
        osd,
        index,
        map,
        listener,
        mut control,
        connections_max,
        idle_timeout,
        metrics,
        auth_key,
        history,
        scrub,
        recovery,
        read_lease,
        prior_read_lease,
        write_ack_wait,
        lease,
        ..
    } = setup;
    let (history, answers) = match history {
        Some((client, answers)) => (Some(client), Some(answers)),
        None => (None, None),
    };
    let listener = TcpListener::from_std(listener).map_err(|e| format!("listener: {e}"))?;
    let view = MapView::new(map, osd, index);
    create_collections(&store, &view).await?;
    let fences = crate::fence::Fences::load(&store).await?;
    tracing::info!(
        epoch = view.map.epoch,
        pgs = view.owned.len(),
        fenced_clients = fences.len(),
        "reactor serving"
    );
    metrics.set_view(view.map.epoch, view.owned.len());
    let shard = Rc::new_cyclic(|me| Shard {
        osd,
        index,
        view: RefCell::new(Rc::new(view)),
        store,
        connections: Cell::new(0),
        fences,
        metrics,
        replication: crate::replication::Replication::new(
            osd,
            auth_key.clone(),
            history,
            scrub,
            recovery,
            crate::replication::Waits {
                read_lease,
                prior_read_lease,
                ack_wait: write_ack_wait,
            },
        ),
        auth_key,
        handshaking: Cell::new(0),
        epoch_line: Default::default(),
        idle_timeout,
        lease,
        removed_pools: Default::default(),
        me: me.clone(),
    });
    if let Some(mut answers) = answers {
        let weak = Rc::downgrade(&shard);
        carmine_reactor::spawn(async move {
            while let Some(answer) = answers.recv().await {
                let Some(shard) = weak.upgrade() else { return };
                crate::replication::on_answer(&shard, answer);
            }
        })
        .detach();
    }
    crate::replication::start(&shard).await?;
    // An OSD that was down when a pool was removed still holds it.
    if shard.view.borrow().map.any_pool_removed() {
        crate::removed_pools::start(&shard);
    }
    let housekeeping = shard.clone();
    carmine_reactor::spawn(async move { housekeeping.store.background().await }).detach();
    shard.metrics.set_statfs(shard.store.statfs());
    shard.metrics.set_store_counters(shard.store.counters());
    let statfs = Rc::downgrade(&shard);
    carmine_reactor::spawn(async move {
        // Space figures for metrics and `cluster status`, and a failed store for the control
        // thread; ends once the shard is gone.
        while let Some(shard) = statfs.upgrade() {
            shard.metrics.set_statfs(shard.store.statfs());
            shard.metrics.set_store_counters(shard.store.counters());
            if let Some(why) = shard.store.failure() {
                shard.metrics.note_store_failure(why);
            }
            drop(shard);
            carmine_reactor::sleep(STATFS_EVERY).await;
        }
    })
    .detach();
    // One accept stays in flight across control messages: an accept dropped after the
    // kernel took a connection would lose that connection, and its client would wait for
    // answers that never come.
    let mut accept = std::pin::pin!(listener.accept());
    loop {
        let ctl = std::pin::pin!(control.recv());
        let event = match select(accept.as_mut(), ctl).await {
            Either::Left((accepted, _)) => Either::Left(accepted),
            Either::Right((msg, _)) => Either::Right(msg),
        };
        if matches!(event, Either::Left(_)) {
            accept.set(listener.accept());
        }
        match event {
            Either::Left(Ok((stream, peer))) => {
                if shard.connections.get() >= connections_max {
                    // Each connection may hold a few MiB of buffers: refuse rather than grow.
                    tracing::warn!(%peer, "refusing connection: {connections_max} already open");
                    shard.metrics.refused_connection();
                    drop(stream);
                    continue;
                }
                if shard.auth_key.is_some() && shard.handshaking.get() >= HANDSHAKES_MAX {
                    // Peers that have not proved anything may not hold the client slots.
                    tracing::warn!(%peer, "refusing connection: {HANDSHAKES_MAX} handshakes in progress");
                    shard.metrics.refused_connection();
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let shard = shard.clone();
                shard.connections.set(shard.connections.get() + 1);
                shard.metrics.set_connections(shard.connections.get());
                carmine_reactor::spawn(async move {
                    let mut stream = stream;
                    let authenticated = match &shard.auth_key {
                        Some(key) => {
                            let _handshaking = Handshaking::new(&shard.handshaking);
                            crate::auth::authenticate(&mut stream, key)
                                .await
                                .map(|entity| {
                                    tracing::debug!(%peer, entity, "authenticated");
                                    Sender::of(&entity)
                                })
                        }
                        None => Ok(Sender::Unauthenticated),
                    };
                    let served = match authenticated {
                        Err(e) => {
                            shard.metrics.refused_auth();
                            Err(format!("not authenticated: {e}"))
                        }
                        // A replicated write waits for the other copies even on a store
                        // that never suspends: such a cluster's connections must keep many
                        // requests in flight.
                        Ok(sender) if S::NEVER_SUSPENDS && !shard.view.borrow().replicated => {
                            serve_connection(&shard, stream, sender).await
                        }
                        Ok(sender) => serve_connection_concurrently(&shard, stream, sender).await,
                    };
                    if let Err(e) = served {
                        tracing::info!(%peer, "connection closed: {e}");
                    }
                    shard.connections.set(shard.connections.get() - 1);
                    shard.metrics.set_connections(shard.connections.get());
                    if let Some(why) = shard.store.failure() {
                        shard.metrics.note_store_failure(why);
                    }
                })
                .detach();
            }
            Either::Left(Err(e)) => {
                // Out of file descriptors and the like: keep serving existing connections.
                tracing::warn!("accept failed: {e}");
                carmine_reactor::sleep(std::time::Duration::from_millis(10)).await;
            }
            Either::Right(Some(ControlMsg::Map(map))) => {
                if map.epoch <= shard.view.borrow().map.epoch {
                    continue;
                }
                let removed = {
                    let old = &shard.view.borrow().map;
                    old.pools.iter().any(|p| map.pool(p.id).is_err())
                };
                let view = MapView::new(map, osd, index);
                // The PGs it gains need their collections before a request can reach them;
                // until the view is swapped, requests for them get WrongTarget and retry.
                create_collections(&shard.store, &view).await?;
                tracing::info!(
                    epoch = view.map.epoch,
                    pgs = view.owned.len(),
                    "new map epoch"
                );
                shard.metrics.set_view(view.map.epoch, view.owned.len());
                *shard.view.borrow_mut() = Rc::new(view);
                crate::replication::on_map(&shard).await?;
                if removed {
                    crate::removed_pools::start(&shard);
                }
            }
            Either::Right(Some(ControlMsg::Shutdown) | None) => break,
        }
    }
    tracing::info!("reactor stopping");
    shard.store.report();
    Ok(())
}

/// Puts the parts of a message between OSDs back together (`Ok(None)`: more to come). Only
/// another OSD sends parts (or anyone, in a cluster without authentication): a client that
/// does loses its connection rather than make this reactor hold its bytes.
fn reassemble(
    parts: &mut Assembly,
    frame: carmine_proto::Frame,
    sender: Sender,
) -> Result<Option<carmine_proto::Frame>, String> {
    if frame.header.opcode == carmine_proto::Opcode::PeerPart && sender == Sender::Client {
        return Err("a client sent part of a message between OSDs".into());
    }
    peer_parts::assemble(parts, frame).map_err(|e| format!("bad message part: {e}"))
}

/// Serves one connection: decode every complete request in the receive buffer, append the
/// replies to one send buffer, write them with one call, read again. Pipelined clients thus
/// get batched reads and writes without any per-request syscall.
///
/// Nothing is in flight while it reads, so a read that sees no byte for the idle timeout
/// (a silent peer, or one that sent half a frame and stalled) ends the connection, and so does
/// a write that sends nothing for that long (a peer that stopped reading its replies).
async fn serve_connection<S: ObjectStore + 'static>(
    shard: &Shard<S>,
    mut stream: TcpStream,
    sender: Sender,
) -> Result<(), String> {
    let mut rbuf = BytesMut::new();
    let mut room = ReadRoom::default();
    // Grows to the largest batch of replies, then is reused.
    let mut wbuf = BytesMut::new();
    let mut watch = Watch::new(shard.idle_timeout);
    let progress = Cell::new(0u64);
    let mut parts = Assembly::default();
    loop {
        loop {
            match try_decode_frame(&mut rbuf) {
                Ok(Some(frame)) => match reassemble(&mut parts, frame, sender) {
                    Ok(Some(frame)) => handle_frame(shard, frame, &mut wbuf, sender).await,
                    Ok(None) => {}
                    Err(e) => {
                        flush(&mut stream, &mut wbuf, &mut watch, &progress).await?;
                        return Err(e);
                    }
                },
                Ok(None) => break,
                // The stream can no longer be trusted: drop this connection only.
                Err(e) => {
                    flush(&mut stream, &mut wbuf, &mut watch, &progress).await?;
                    return Err(format!("bad frame: {e}"));
                }
            }
            if wbuf.len() >= WRITE_FLUSH_BYTES {
                flush(&mut stream, &mut wbuf, &mut watch, &progress).await?;
            }
        }
        flush(&mut stream, &mut wbuf, &mut watch, &progress).await?;
        let pending = rbuf.len();
        room.prepare(&mut rbuf);
        let read = read_some(&mut stream, rbuf, 1);
        let Some((res, buf)) = watched(read, &mut watch, &progress).await else {
            return Err(watch.idle_reason(pending));
        };
        rbuf = buf;
        match res {
            Ok(0) if rbuf.is_empty() => return Ok(()),
            Ok(0) => {
                return Err(format!(
                    "peer closed mid-frame with {} bytes pending",
                    rbuf.len()
                ))
            }
            Ok(n) => {
                room.filled(n);
                progress.set(progress.get() + 1);
            }
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

/// How much room the next read of a connection gets: little until the peer fills it, then
/// `READ_SPARE_MAX` until it sends little again. The large buffer is given back before the
/// next read once the peer is quiet, and a partial frame never doubles it.
struct ReadRoom {
    want: usize,
    offered: usize,
}

impl Default for ReadRoom {
    fn default() -> Self {
        Self {
            want: READ_SPARE_SMALL,
            offered: 0,
        }
    }
}

impl ReadRoom {
    /// Makes room in `rbuf` for the next read.
    fn prepare(&mut self, rbuf: &mut BytesMut) {
        if rbuf.is_empty() && self.want == READ_SPARE_SMALL && rbuf.capacity() > 2 * self.want {
            *rbuf = BytesMut::new();
        }
        if rbuf.capacity() - rbuf.len() < self.want / 2 {
            rbuf.reserve(self.want);
        }
        self.offered = rbuf.capacity() - rbuf.len();
    }

    /// The read it prepared for brought `n` bytes.
    fn filled(&mut self, n: usize) {
        if n * 2 >= self.offered {
            self.want = READ_SPARE_MAX;
        } else if n < READ_SPARE_SMALL / 2 {
            self.want = READ_SPARE_SMALL;
        }
    }
}

/// A connection's idle timeout and the watchdog enforcing it (none if it has none).
struct Watch(Option<(Duration, Watchdog)>);

impl Watch {
    fn new(idle_timeout: Option<Duration>) -> Self {
        Watch(idle_timeout.map(|t| (t, Watchdog::new(t))))
    }

    /// Ready once `progress` has not moved for the idle timeout; checked a few times per
    /// timeout, never when there is none.
    fn poll_expired(&mut self, cx: &mut std::task::Context<'_>, progress: u64) -> Poll<()> {
        let Some((timeout, dog)) = &mut self.0 else {
            return Poll::Pending;
        };
        while let Poll::Ready(quiet) = dog.poll_check(cx, progress) {
            if quiet >= *timeout {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }

    fn timeout(&self) -> Duration {
        self.0.as_ref().map_or(Duration::MAX, |(t, _)| *t)
    }

    /// Why an idle connection is closed: `pending` bytes of a frame had arrived.
    fn idle_reason(&self, pending: usize) -> String {
        match pending {
            0 => format!("idle for {:?}: closing it", self.timeout()),
            n => format!(
                "stalled for {:?} with {n} bytes of a frame received: closing it",
                self.timeout()
            ),
        }
    }

    fn stall_reason(&self) -> String {
        format!(
            "the peer took no reply bytes for {:?}: closing it",
            self.timeout()
        )
    }
}

/// Runs `fut` unless `progress` stays still for the idle timeout first; then returns `None`
/// and drops `fut`, which cancels its socket operation. Only socket I/O is ever run here:
/// store futures are never dropped half way.
async fn watched<F: Future>(fut: F, watch: &mut Watch, progress: &Cell<u64>) -> Option<F::Output> {
    if watch.0.is_none() {
        return Some(fut.await);
    }
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        watch.poll_expired(cx, progress.get()).map(|()| None)
    })
    .await
}

/// Requests of one connection in progress at once, for stores that suspend; beyond it the
/// connection stops reading (back-pressure on the client).
const CONNECTION_INFLIGHT_MAX: usize = 256;
/// Reply bytes a connection may hold for a peer that is slow to read them; beyond it the
/// connection stops reading requests (the replies of those in flight still complete).
const CONNECTION_BACKLOG_BYTES: usize = 8 << 20;
/// Request bytes (frames) one connection may have in flight: past it, no more are decoded
/// until some complete. One request of any legal size always gets through alone.
const CONNECTION_INFLIGHT_BYTES: usize = 32 << 20;

type ReadDone = ((std::io::Result<usize>, BytesMut), TcpStream);
type WriteDone = ((std::io::Result<()>, BytesMut), TcpStream);

/// Serves one connection whose requests may suspend (device I/O): each request runs as its
/// own future, so one connection keeps many in flight — which is what lets the native store
/// gather them into one journal write. Replies go out as they complete; the client matches
/// them by request id. A request that completes on its first poll costs no more than a box.
///
/// Reading, writing and the requests progress independently: a peer that stops reading its
/// replies stops this connection from taking new requests, but the ones it has in flight
/// still run to completion (other clients may be waiting on them), and a connection that
/// ends — a bad frame, a reset — first finishes what it accepted. No request future is
/// dropped half way while the daemon runs.
///
/// With an idle timeout, a connection that makes no progress for that long — no byte read, no
/// request completed, no reply byte sent — is closed if nothing waits on the store: either
/// nothing is in flight and nothing is unsent (an idle peer, or one stalled mid-frame), or a
/// write of replies is stuck (a peer that stopped reading them; its requests in flight still
/// complete first, their replies dropped). Requests waiting on the store never time out.
async fn serve_connection_concurrently<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    stream: TcpStream,
    sender: Sender,
) -> Result<(), String> {
    let (reader, writer) = stream.into_split();
    let mut rbuf = BytesMut::new();
    let mut room = ReadRoom::default();
    // Both grow to the largest batch of replies, then are reused.
    let mut wbuf = BytesMut::new();
    let mut spare = BytesMut::new();
    let mut inflight: FuturesUnordered<LocalBoxFuture<'static, Done>> = FuturesUnordered::new();
    // Bytes of the requests in flight (their frames; a read's reply is bounded by the
    // backlog): with the backlog, what one connection can make the reactor hold.
    let mut inflight_bytes = 0usize;
    let mut reader = Some(reader);
    let mut writer = Some(writer);
    let mut reading: Option<LocalBoxFuture<'static, ReadDone>> = None;
    let mut writing: Option<LocalBoxFuture<'static, WriteDone>> = None;
    // No more requests are read: the peer closed, or the stream can no longer be trusted.
    let mut closed = false;
    // Why the connection ends in error, once it does.
    let mut failure: Option<String> = None;
    // Replies are dropped, not sent, once a write failed.
    let mut write_failed = false;
    // Bumped on every read, completed request and reply bytes sent: the watchdog's input.
    let progress = Rc::new(Cell::new(0u64));
    let mut watch = Watch::new(shard.idle_timeout);
    // Bytes of a partial frame held when the current read started.
    let mut pending = 0usize;
    // The receive buffer holds no whole frame (it was decoded up to a partial one).
    let mut no_whole_frame = true;
    let mut parts = Assembly::default();
    loop {
        // Decode what was read, as far as the in-flight and backlog bounds allow.
        while !closed
            && inflight.len() < CONNECTION_INFLIGHT_MAX
            && wbuf.len() < CONNECTION_BACKLOG_BYTES
        {
            let frame = match try_decode_frame(&mut rbuf) {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    no_whole_frame = true;
                    break;
                }
                Err(e) => {
                    failure = Some(format!("bad frame: {e}"));
                    closed = true;
                    rbuf.clear();
                    break;
                }
            };
            let frame = match reassemble(&mut parts, frame, sender) {
                Ok(Some(frame)) => frame,
                Ok(None) => continue,
                Err(e) => {
                    failure = Some(e);
                    closed = true;
                    rbuf.clear();
                    break;
                }
            };
            let shard = shard.clone();
            let cost = carmine_proto::FRAME_HEADER_LEN + frame.payload.len();
            let mut request: LocalBoxFuture<'static, Done> = Box::pin(async move {
                let mut out = BytesMut::new();
                handle_frame(&shard, frame, &mut out, sender).await;
                (out, cost)
            });
            match futures::poll!(request.as_mut()) {
                std::task::Poll::Ready((out, _)) => wbuf.extend_from_slice(&out),
                std::task::Poll::Pending => {
                    inflight_bytes += cost;
                    inflight.push(request);
                }
            }
        }
        while let std::task::Poll::Ready(Some((out, cost))) = futures::poll!(inflight.next()) {
            inflight_bytes -= cost;
            wbuf.extend_from_slice(&out);
        }
        if write_failed {
            wbuf.clear();
        }
        if writing.is_none() && !wbuf.is_empty() {
            let mut w = writer
                .take()
                .expect("writer is home when no write is in flight");
            let buf = std::mem::replace(&mut wbuf, std::mem::take(&mut spare));
            progress.set(progress.get() + 1);
            let progress = progress.clone();
            writing = Some(Box::pin(async move {
                (write_all_noting(&mut w, buf, &progress).await, w)
            }));
        }
        if closed && inflight.is_empty() && writing.is_none() {
            return match failure {
                Some(why) => Err(why),
                None if rbuf.is_empty() => Ok(()),
                None => Err(format!(
                    "peer closed mid-frame with {} bytes pending",
                    rbuf.len()
                )),
            };
        }
        // A read takes the receive buffer until bytes arrive: it must not start while that
        // holds whole requests a bound kept back (their client waits for their replies, not
        // sending more, and the connection would hang).
        if reading.is_none()
            && !closed
            && no_whole_frame
            && inflight.len() < CONNECTION_INFLIGHT_MAX
            && wbuf.len() < CONNECTION_BACKLOG_BYTES
            && inflight_bytes < CONNECTION_INFLIGHT_BYTES
        {
            let mut r = reader
                .take()
                .expect("reader is home when no read is in flight");
            pending = rbuf.len();
            room.prepare(&mut rbuf);
            let buf = std::mem::take(&mut rbuf);
            reading = Some(Box::pin(async move {
                let res = read_some(&mut r, buf, 1).await;
                (res, r)
            }));
        }
        let event = next_event(
            &mut reading,
            &mut writing,
            &mut inflight,
            &mut watch,
            &progress,
        );
        match event.await {
            Event::Read(((res, buf), r)) => {
                reading = None;
                reader = Some(r);
                rbuf = buf;
                no_whole_frame = false;
                match res {
                    Ok(0) => closed = true,
                    Ok(n) => {
                        room.filled(n);
                        progress.set(progress.get() + 1);
                    }
                    Err(e) => {
                        closed = true;
                        failure.get_or_insert(format!("read: {e}"));
                    }
                }
            }
            Event::Written(((res, mut buf), w)) => {
                writing = None;
                writer = Some(w);
                buf.clear();
                spare = buf;
                if let Err(e) = res {
                    closed = true;
                    write_failed = true;
                    failure.get_or_insert(format!("write: {e}"));
                }
            }
            Event::Reply((out, cost)) => {
                progress.set(progress.get() + 1);
                inflight_bytes -= cost;
                wbuf.extend_from_slice(&out);
            }
            Event::Quiet if writing.is_some() => {
                // Dropping the write cancels it; the write half goes with it.
                writing = None;
                closed = true;
                write_failed = true;
                failure.get_or_insert(watch.stall_reason());
            }
            Event::Quiet if inflight.is_empty() => {
                // Nothing in flight and no write: wbuf is empty, only the read is pending.
                closed = true;
                let pending = if reading.is_some() {
                    pending
                } else {
                    rbuf.len()
                };
                failure.get_or_insert(watch.idle_reason(pending));
            }
            // Requests wait on the store: its business, not the peer's.
            Event::Quiet => {}
        }
    }
}

/// What woke a connection serving concurrent requests.
enum Event {
    Read(ReadDone),
    Written(WriteDone),
    Reply(Done),
    /// No progress for the idle timeout.
    Quiet,
}

/// A finished request: its reply, and the bytes its frame counted against the connection.
type Done = (BytesMut, usize);

/// The first of: the read, the write, a request's reply, the idle timeout. At least one of the
/// first three must be in progress.
async fn next_event(
    reading: &mut Option<LocalBoxFuture<'static, ReadDone>>,
    writing: &mut Option<LocalBoxFuture<'static, WriteDone>>,
    inflight: &mut FuturesUnordered<LocalBoxFuture<'static, Done>>,
    watch: &mut Watch,
    progress: &Cell<u64>,
) -> Event {
    use std::task::Poll;
    std::future::poll_fn(|cx| {
        if let Some(Poll::Ready(done)) = reading.as_mut().map(|r| r.as_mut().poll(cx)) {
            return Poll::Ready(Event::Read(done));
        }
        if let Some(Poll::Ready(done)) = writing.as_mut().map(|w| w.as_mut().poll(cx)) {
            return Poll::Ready(Event::Written(done));
        }
        if !inflight.is_empty() {
            if let Poll::Ready(Some(out)) = inflight.poll_next_unpin(cx) {
                return Poll::Ready(Event::Reply(out));
            }
        }
        watch
            .poll_expired(cx, progress.get())
            .map(|()| Event::Quiet)
    })
    .await
}

async fn flush(
    stream: &mut TcpStream,
    wbuf: &mut BytesMut,
    watch: &mut Watch,
    progress: &Cell<u64>,
) -> Result<(), String> {
    if wbuf.is_empty() {
        return Ok(());
    }
    progress.set(progress.get() + 1);
    let write = write_all_noting(stream, std::mem::take(wbuf), progress);
    let Some((res, buf)) = watched(write, watch, progress).await else {
        return Err(watch.stall_reason());
    };
    *wbuf = buf;
    res.map_err(|e| format!("write: {e}"))
}
