//! Handshake and transmission over one TCP connection.

use crate::protocol::*;
use async_lock::Semaphore;
use bytes::{BufMut, Bytes, BytesMut};
use carmine_reactor::io::{read_some, shutdown_write, write_all, write_all_noting};
use carmine_reactor::{
    Doorbell, Mailbox, MailboxSender, Socket, TcpListener, TcpStream, UnixListener, UnixStream,
    Watchdog,
};
use carmine_volume::{Image, VolumeError};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// A volume offered to NBD clients under `name`.
#[derive(Clone)]
pub struct Export {
    pub name: String,
    pub image: Image,
    pub read_only: bool,
}

#[derive(Clone, Debug)]
pub struct NbdConfig {
    /// Requests of one connection executing at once; further requests wait to be read.
    pub inflight_max: usize,
    /// Bytes one connection may hold: payloads and read replies of requests executing, plus
    /// replies not yet sent. Beyond it the connection stops reading requests, so a client
    /// that never reads its replies costs a bounded amount of memory.
    pub connection_bytes_max: usize,
    /// Open connections at once; more are closed at accept.
    pub connections_max: usize,
    /// A client must finish the handshake within this time. Afterwards, a client that stalls
    /// for this long in the middle of an exchange is dropped too: half a request received
    /// and nothing more, or replies waiting that it takes no byte of.
    pub handshake_timeout: Duration,
    /// Drop a client that sends nothing for this long while it has no request executing and
    /// no reply unsent. `None` (the default): never, as the kernel and QEMU keep idle
    /// connections open for hours on purpose.
    pub idle_timeout: Option<Duration>,
    /// Counters, shared with whoever wants to watch the server.
    pub stats: Arc<NbdStats>,
}

impl Default for NbdConfig {
    fn default() -> Self {
        Self {
            inflight_max: 256,
            connection_bytes_max: 64 << 20,
            connections_max: 1024,
            handshake_timeout: Duration::from_secs(30),
            idle_timeout: None,
            stats: Arc::default(),
        }
    }
}

/// What the server has done so far (readable from any thread).
#[derive(Debug, Default)]
pub struct NbdStats {
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub connections_closed: AtomicU64,
    /// Connections counted in and not yet closed, over every reactor of the gateway.
    pub connections_open: AtomicU64,
    pub accept_errors: AtomicU64,
    /// The most bytes any one connection held at once (requests executing plus replies
    /// unsent): stays within `connection_bytes_max` plus one request.
    pub held_bytes_max: AtomicU64,
}

const READ_SPARE_MIN: usize = 256 * 1024;
/// The largest reply buffer a connection keeps for its next batch.
const SPARE_KEEP_MAX: usize = 4 << 20;
/// Bytes a reply costs beyond its data (header, chunk framing), rounded up.
const REPLY_OVERHEAD: usize = 64;
/// Preferred block size advertised to clients: the store's page.
const BLOCK_SIZE_PREFERRED: u32 = 4096;

/// Accepts TCP connections until the listener fails for good; each connection is served by
/// its own task, on this reactor or, in turn, on the others of `spread`.
pub async fn serve(
    listener: TcpListener,
    exports: Rc<Vec<Export>>,
    cfg: NbdConfig,
    spread: Rc<Spread>,
) -> io::Result<()> {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                if !count_in(&cfg) {
                    continue;
                }
                let peer = peer.to_string();
                match spread.pick() {
                    None => spawn_served(stream, peer, &exports, &cfg),
                    Some(to) => {
                        let handed = handoff(&stream).map(|s| Accepted::Tcp(s, peer.clone()));
                        spread.hand(to, handed, &peer, &cfg).await;
                    }
                }
            }
            Err(e) => accept_failed(e, &cfg).await?,
        }
    }
}

/// Accepts Unix-domain socket connections until the listener fails for good, spread over the
/// reactors like TCP ones.
pub async fn serve_unix(
    listener: UnixListener,
    exports: Rc<Vec<Export>>,
    cfg: NbdConfig,
    spread: Rc<Spread>,
) -> io::Result<()> {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                if !count_in(&cfg) {
                    continue;
                }
                let peer = "unix socket".to_string();
                match spread.pick() {
                    None => spawn_served(stream, peer, &exports, &cfg),
                    Some(to) => {
                        let handed = handoff(&stream).map(Accepted::Unix);
                        spread.hand(to, handed, &peer, &cfg).await;
                    }
                }
            }
            Err(e) => accept_failed(e, &cfg).await?,
        }
    }
}

/// A connection one reactor accepted for another to serve (`carmine nbd serve --reactors N`).
/// It travels as a plain descriptor: a socket of one io_uring runtime is not another's.
pub enum Accepted {
    Tcp(std::net::TcpStream, String),
    Unix(std::os::unix::net::UnixStream),
}

/// Where accepted connections are served: the accepting reactor and the other reactors'
/// mailboxes, in turn, so N connections land on N different reactors.
pub struct Spread {
    others: Vec<RefCell<MailboxSender<Accepted>>>,
    next: Cell<usize>,
    /// Connections served per reactor, this one first.
    served: RefCell<Vec<u64>>,
}

impl Spread {
    /// Every connection is served by the reactor that accepted it.
    pub fn local() -> Rc<Spread> {
        Spread::over(Vec::new())
    }

    /// Connections go in turn to this reactor and to each of `others`.
    pub fn over(others: Vec<MailboxSender<Accepted>>) -> Rc<Spread> {
        Rc::new(Spread {
            served: RefCell::new(vec![0; others.len() + 1]),
            others: others.into_iter().map(RefCell::new).collect(),
            next: Cell::new(0),
        })
    }

    /// Connections given to each reactor so far, the accepting one first.
    pub fn served(&self) -> Vec<u64> {
        self.served.borrow().clone()
    }

    /// `None`: serve the next connection here; `Some(i)`: hand it to `others[i]`.
    fn pick(&self) -> Option<usize> {
        let n = self.next.get();
        self.next.set((n + 1) % (self.others.len() + 1));
        self.served.borrow_mut()[n] += 1;
        n.checked_sub(1)
    }

    /// Hands a connection over. What waits in a mailbox is bounded by `connections_max`: a
    /// connection is counted in before it is handed over. A connection that cannot be handed
    /// over is closed and no longer counted.
    async fn hand(&self, to: usize, conn: io::Result<Accepted>, peer: &str, cfg: &NbdConfig) {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    peer,
                    "cannot hand the connection to reactor {}: {e}",
                    to + 1
                );
                count_out(cfg);
                return;
            }
        };
        // A clone per connection: a RefCell borrow must not live across the send. (A fresh
        // clone always has a slot, so this never waits; the count above is the bound.)
        let mut tx = self.others[to].borrow().clone();
        if tx.send(conn).await.is_err() {
            tracing::warn!(peer, "reactor {} is gone; connection closed", to + 1);
            count_out(cfg);
        }
    }
}

/// A descriptor of its own for an accepted socket, to travel to another reactor; the
/// accepting runtime's handle is closed when `stream` is dropped.
fn handoff<S, T>(stream: &S) -> io::Result<T>
where
    S: std::os::fd::AsFd,
    T: From<std::os::fd::OwnedFd>,
{
    Ok(T::from(stream.as_fd().try_clone_to_owned()?))
}

/// Serves connections that another reactor accepted and handed here, until it stops handing
/// them (the mailbox's senders are gone).
pub async fn serve_handed(
    mut mailbox: Mailbox<Accepted>,
    exports: Rc<Vec<Export>>,
    cfg: NbdConfig,
) {
    while let Some(conn) = mailbox.recv().await {
        let started = match conn {
            Accepted::Tcp(s, peer) => {
                TcpStream::from_std(s).map(|s| spawn_served(s, peer, &exports, &cfg))
            }
            Accepted::Unix(s) => UnixStream::from_std(s)
                .map(|s| spawn_served(s, "unix socket".into(), &exports, &cfg)),
        };
        if let Err(e) = started {
            tracing::warn!("cannot serve a handed connection: {e}");
            count_out(&cfg);
        }
    }
}

/// Out of descriptors, memory or buffers, or a connection that died in the queue: those pass,
/// so the gateway keeps serving the clients it has. Anything else ends it.
async fn accept_failed(e: io::Error, cfg: &NbdConfig) -> io::Result<()> {
    let transient = matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::ECONNABORTED)
            | Some(libc::EPERM | libc::EPROTO | libc::EINTR | libc::EAGAIN)
    );
    if !transient {
        return Err(e);
    }
    cfg.stats.accept_errors.fetch_add(1, Ordering::Relaxed);
    tracing::warn!("accept failed ({e}); still serving the open connections");
    // Give descriptors time to come back instead of spinning on the error.
    carmine_reactor::sleep(std::time::Duration::from_millis(20)).await;
    Ok(())
}

/// Counts a new connection in, unless `connections_max` are open (over all reactors): then
/// it is refused (closed when the caller drops it).
fn count_in(cfg: &NbdConfig) -> bool {
    let stats = &cfg.stats;
    let admitted = stats
        .connections_open
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < cfg.connections_max as u64).then_some(n + 1)
        });
    match admitted {
        Ok(_) => {
            stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(open) => {
            stats.connections_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("refusing connection: {open} open");
            false
        }
    }
}

fn count_out(cfg: &NbdConfig) {
    cfg.stats.connections_open.fetch_sub(1, Ordering::AcqRel);
    cfg.stats.connections_closed.fetch_add(1, Ordering::Relaxed);
}

/// Serves a counted-in connection on this reactor, in a task of its own.
fn spawn_served<S: Socket>(stream: S, peer: String, exports: &Rc<Vec<Export>>, cfg: &NbdConfig) {
    let (exports, cfg) = (exports.clone(), cfg.clone());
    carmine_reactor::spawn(async move {
        match serve_connection(stream, exports, cfg.clone()).await {
            Ok(()) => tracing::info!(peer, "nbd client disconnected"),
            Err(e) => tracing::warn!(peer, "nbd connection ended: {e}"),
        }
        count_out(&cfg);
    })
    .detach();
}

/// Buffered reads of exact sizes from the socket.
struct Wire<S> {
    stream: S,
    rbuf: BytesMut,
}

impl<S: Socket> Wire<S> {
    async fn take(&mut self, n: usize) -> io::Result<Bytes> {
        while self.rbuf.len() < n {
            let spare = READ_SPARE_MIN.max(n - self.rbuf.len());
            let (res, buf) =
                read_some(&mut self.stream, std::mem::take(&mut self.rbuf), spare).await;
            self.rbuf = buf;
            if res? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "client closed the connection",
                ));
            }
        }
        Ok(self.rbuf.split_to(n).freeze())
    }

    /// `take` in the transmission phase: fails with `TimedOut` if the client stalls half way
    /// through a request (`mid_request`, or part of a header received) for the stall timeout,
    /// or sends nothing while it has nothing executing or unsent for the idle timeout; with
    /// `BrokenPipe` once its replies can no longer be sent.
    async fn take_watched(
        &mut self,
        n: usize,
        mid_request: bool,
        watch: &mut ReadWatch,
        replies: &Replies,
    ) -> io::Result<Bytes> {
        while self.rbuf.len() < n {
            let partial = mid_request || !self.rbuf.is_empty();
            let spare = READ_SPARE_MIN.max(n - self.rbuf.len());
            let read = read_some(&mut self.stream, std::mem::take(&mut self.rbuf), spare);
            let mut why = None;
            let give_up = |quiet: Duration| {
                why = if replies.failed.get() {
                    Some((
                        io::ErrorKind::BrokenPipe,
                        "replies can no longer be sent".into(),
                    ))
                } else if partial && quiet >= watch.stall {
                    Some((
                        io::ErrorKind::TimedOut,
                        format!("stalled mid-request for {quiet:?}"),
                    ))
                } else if !partial
                    && replies.held() == 0
                    && watch.idle.is_some_and(|idle| quiet >= idle)
                {
                    Some((io::ErrorKind::TimedOut, format!("idle for {quiet:?}")))
                } else {
                    None
                };
                why.is_some()
            };
            let Some((res, buf)) = watched(read, &mut watch.dog, &replies.progress, give_up).await
            else {
                let (kind, msg) = why.expect("a reason to give up");
                return Err(io::Error::new(kind, msg));
            };
            self.rbuf = buf;
            if res? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "client closed the connection",
                ));
            }
            replies.progress.set(replies.progress.get() + 1);
        }
        Ok(self.rbuf.split_to(n).freeze())
    }

    async fn send(&mut self, out: &mut BytesMut) -> io::Result<()> {
        let (res, buf) = write_all(&mut self.stream, std::mem::take(out)).await;
        *out = buf;
        res
    }
}

/// The reader's stall and idle timeouts and the watchdog enforcing them.
struct ReadWatch {
    dog: Watchdog,
    stall: Duration,
    idle: Option<Duration>,
}

/// Runs `fut` until it completes, or until `give_up` — asked a few times per timeout how long
/// `progress` has not moved — says to stop; then returns `None` and drops `fut`, which cancels
/// its socket operation.
async fn watched<F: Future>(
    fut: F,
    dog: &mut Watchdog,
    progress: &Cell<u64>,
    mut give_up: impl FnMut(Duration) -> bool,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        while let Poll::Ready(quiet) = dog.poll_check(cx, progress.get()) {
            if give_up(quiet) {
                return Poll::Ready(None);
            }
        }
        Poll::Pending
    })
    .await
}

fn transmission_flags(e: &Export) -> u16 {
    let mut f = TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_SEND_CACHE
        | TFLAG_CAN_MULTI_CONN;
    if e.read_only {
        f |= TFLAG_READ_ONLY;
    }
    f
}

fn protocol_err(e: ProtocolError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Serves one client: option negotiation, then requests until it disconnects.
pub async fn serve_connection<S: Socket>(
    stream: S,
    exports: Rc<Vec<Export>>,
    cfg: NbdConfig,
) -> io::Result<()> {
    let mut wire = Wire {
        stream,
        rbuf: BytesMut::with_capacity(READ_SPARE_MIN),
    };
    let negotiated =
        carmine_reactor::timeout(cfg.handshake_timeout, negotiate(&mut wire, &exports))
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no handshake within {:?}", cfg.handshake_timeout),
                ))
            });
    let session = match negotiated {
        Ok(Some(session)) => session,
        Ok(None) => return Ok(()),
        // Probing clients (e.g. `qemu-img info`, `nbdinfo --list`) may just hang up.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
        Err(e) => return Err(e),
    };
    transmit(wire, session, cfg).await
}

/// What the client and server agreed on during negotiation.
struct Session {
    export: Export,
    /// Structured replies negotiated: READ replies are chunks, as the protocol then requires.
    structured: bool,
}

/// Runs the fixed-newstyle handshake. Returns the export to serve, or `None` if the client
/// ended the negotiation.
async fn negotiate<S: Socket>(
    wire: &mut Wire<S>,
    exports: &[Export],
) -> io::Result<Option<Session>> {
    let mut out = BytesMut::with_capacity(256);
    out.put_u64(NBDMAGIC);
    out.put_u64(IHAVEOPT);
    out.put_u16(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    wire.send(&mut out).await?;
    let client_flags = u32::from_be_bytes(wire.take(4).await?[..].try_into().expect("4 bytes"));
    if client_flags & FLAG_C_FIXED_NEWSTYLE == 0 {
        return Err(protocol_err(ProtocolError::NotFixedNewstyle(client_flags)));
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let mut structured = false;
    loop {
        let hdr =
            parse_option_header(&wire.take(OPTION_HEADER_LEN).await?).map_err(protocol_err)?;
        let data = wire.take(hdr.len as usize).await?;
        let find = |name: &str| exports.iter().find(|e| e.name == name).cloned();
        match hdr.option {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data).into_owned();
                // The old-style option has no way to report an error: the spec says close.
                let Some(export) = find(&name) else {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("no export named {name:?}"),
                    ));
                };
                out.put_u64(export.image.size());
                out.put_u16(transmission_flags(&export));
                if !no_zeroes {
                    out.put_bytes(0, 124);
                }
                wire.send(&mut out).await?;
                return Ok(Some(Session { export, structured }));
            }
            OPT_STRUCTURED_REPLY if data.is_empty() => {
                structured = true;
                put_option_reply(&mut out, hdr.option, REP_ACK, &[]);
            }
            OPT_STRUCTURED_REPLY => put_option_reply(
                &mut out,
                hdr.option,
                REP_ERR_INVALID,
                b"STRUCTURED_REPLY takes no data",
            ),
            OPT_ABORT => {
                put_option_reply(&mut out, hdr.option, REP_ACK, &[]);
                let _ = wire.send(&mut out).await;
                return Ok(None);
            }
            OPT_LIST if data.is_empty() => {
                for e in exports {
                    let mut d = BytesMut::new();
                    d.put_u32(e.name.len() as u32);
                    d.put_slice(e.name.as_bytes());
                    put_option_reply(&mut out, hdr.option, REP_SERVER, &d);
                }
                put_option_reply(&mut out, hdr.option, REP_ACK, &[]);
            }
            OPT_INFO | OPT_GO => match parse_info_request(hdr.option, data) {
                Err(e) => put_option_reply(
                    &mut out,
                    hdr.option,
                    REP_ERR_INVALID,
                    e.to_string().as_bytes(),
                ),
                Ok((name, infos)) => match find(&name) {
                    None => {
                        let msg = format!("no export named {name:?}");
                        put_option_reply(&mut out, hdr.option, REP_ERR_UNKNOWN, msg.as_bytes());
                    }
                    Some(export) => {
                        put_export_info(&mut out, hdr.option, &export, &infos);
                        put_option_reply(&mut out, hdr.option, REP_ACK, &[]);
                        if hdr.option == OPT_GO {
                            wire.send(&mut out).await?;
                            return Ok(Some(Session { export, structured }));
                        }
                    }
                },
            },
            OPT_LIST => {
                put_option_reply(&mut out, hdr.option, REP_ERR_INVALID, b"LIST takes no data")
            }
            // STARTTLS, meta contexts (block status)…: not offered; clients fall back.
            other => {
                let msg = format!("option {other} is not supported");
                put_option_reply(&mut out, hdr.option, REP_ERR_UNSUP, msg.as_bytes());
            }
        }
        wire.send(&mut out).await?;
    }
}

fn put_export_info(out: &mut BytesMut, option: u32, export: &Export, infos: &[u16]) {
    let mut d = BytesMut::new();
    d.put_u16(INFO_EXPORT);
    d.put_u64(export.image.size());
    d.put_u16(transmission_flags(export));
    put_option_reply(out, option, REP_INFO, &d);
    if infos.contains(&INFO_NAME) {
        let mut d = BytesMut::new();
        d.put_u16(INFO_NAME);
        d.put_slice(export.name.as_bytes());
        put_option_reply(out, option, REP_INFO, &d);
    }
    if infos.contains(&INFO_BLOCK_SIZE) {
        let mut d = BytesMut::new();
        d.put_u16(INFO_BLOCK_SIZE);
        d.put_u32(1);
        d.put_u32(BLOCK_SIZE_PREFERRED);
        d.put_u32(PAYLOAD_LEN_MAX);
        put_option_reply(out, option, REP_INFO, &d);
    }
}

/// Replies waiting to be sent, shared by the request tasks and the writer task.
struct Replies {
    buf: RefCell<BytesMut>,
    bell: Doorbell,
    /// The reader is done and every request finished: the writer flushes and closes.
    closing: Cell<bool>,
    failed: Cell<bool>,
    structured: bool,
    /// Bytes admitted for requests still executing (payloads, read replies to come).
    executing: Cell<usize>,
    /// Reply bytes queued or being written.
    unsent: Cell<usize>,
    /// Rung when either count drops: the reader may admit more.
    room: Doorbell,
    /// Bumped on every read, completed request and reply batch sent: the reader's watchdog
    /// input.
    progress: Cell<u64>,
}

impl Replies {
    fn held(&self) -> usize {
        self.executing.get() + self.unsent.get()
    }
}

impl Replies {
    /// Queues the reply to `req`: READ data travels in it when `data` is `Some`.
    fn push(&self, req: &Request, error: u32, data: Option<&[u8]>) {
        if self.failed.get() {
            return;
        }
        let mut buf = self.buf.borrow_mut();
        let before = buf.len();
        // With structured replies a READ must be answered in chunks; other commands may keep
        // simple replies.
        match (self.structured && req.cmd == CMD_READ, error, data) {
            (true, 0, d) => put_read_chunk(&mut buf, req.cookie, req.offset, d.unwrap_or(&[])),
            (true, e, _) => put_error_chunk(&mut buf, req.cookie, e),
            (false, e, d) => {
                put_simple_reply(&mut buf, e, req.cookie);
                if let (0, Some(d)) = (e, d) {
                    buf.put_slice(d);
                }
            }
        }
        self.unsent.set(self.unsent.get() + buf.len() - before);
        drop(buf);
        self.bell.ring();
    }
}

/// Sends the queued replies. A client that takes no byte of them for `stall` is given up on:
/// the replies fail, as if the connection had broken.
async fn write_replies<S: Socket>(replies: Rc<Replies>, mut stream: S, stall: Duration) {
    let mut dog = Watchdog::new(stall);
    let progress = Cell::new(0u64);
    // The buffer of the last batch sent: replies queued while a batch is on its way go into
    // it, so they append to memory already grown instead of regrowing an empty one.
    let mut spare = BytesMut::new();
    loop {
        replies.bell.wait().await;
        loop {
            if replies.buf.borrow().is_empty() {
                break;
            }
            let batch =
                std::mem::replace(&mut *replies.buf.borrow_mut(), std::mem::take(&mut spare));
            let sent = batch.len();
            progress.set(progress.get() + 1);
            let write = write_all_noting(&mut stream, batch, &progress);
            let written = watched(write, &mut dog, &progress, |quiet| quiet >= stall).await;
            replies.unsent.set(replies.unsent.get() - sent);
            replies.progress.set(replies.progress.get() + 1);
            replies.room.ring();
            let Some((res, sent_buf)) = written else {
                tracing::warn!("nbd client took no reply bytes for {stall:?}; dropping it");
                replies.failed.set(true);
                return;
            };
            if res.is_err() {
                replies.failed.set(true);
                return;
            }
            // One burst of large reads must not pin its memory for the connection's life.
            if sent_buf.capacity() <= SPARE_KEEP_MAX {
                spare = sent_buf;
                spare.clear();
            }
        }
        if replies.closing.get() || replies.failed.get() {
            let _ = shutdown_write(&mut stream).await;
            return;
        }
    }
}

fn errno(e: &VolumeError) -> u32 {
    match e {
        VolumeError::OutOfRange { .. } | VolumeError::InvalidArgument(_) => EINVAL,
        VolumeError::Client(c) if c.status() == Some(carmine_proto::Status::NoSpace) => ENOSPC,
        _ => EIO,
    }
}

/// Executes one request and queues its reply.
async fn execute(export: &Export, req: Request, payload: Bytes, replies: &Replies) {
    let image = &export.image;
    let (off, len) = (req.offset, req.len as u64);
    let in_range = off.checked_add(len).is_some_and(|end| end <= image.size());
    let writes = matches!(req.cmd, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    let result: Result<Option<Bytes>, u32> = if writes && export.read_only {
        Err(EPERM)
    } else if !in_range && req.cmd != CMD_FLUSH {
        Err(EINVAL)
    } else {
        match req.cmd {
            CMD_READ => image.read(off, len).await.map(Some).map_err(|e| errno(&e)),
            CMD_WRITE => image
                .write(off, payload)
                .await
                .map(|_| None)
                .map_err(|e| errno(&e)),
            CMD_TRIM => image
                .discard(off, len)
                .await
                .map(|_| None)
                .map_err(|e| errno(&e)),
            CMD_WRITE_ZEROES => image
                .write_zeroes(off, len)
                .await
                .map(|_| None)
                .map_err(|e| errno(&e)),
            CMD_FLUSH => image.flush().await.map(|_| None).map_err(|e| errno(&e)),
            // Nothing to prefetch: every read goes to the OSD's memory anyway.
            CMD_CACHE => Ok(None),
            _ => Err(EINVAL),
        }
    };
    // FUA: the write above was acknowledged by the store, which acknowledges only durable
    // writes; a flush barrier adds nothing, but is issued so the intent survives a cache.
    let result = match result {
        Ok(v) if req.flags & CMD_FLAG_FUA != 0 && writes => {
            image.flush().await.map(|_| v).map_err(|e| errno(&e))
        }
        other => other,
    };
    match result {
        Ok(data) => replies.push(&req, 0, data.as_deref()),
        Err(e) => replies.push(&req, e, None),
    }
}

/// The transmission phase: read requests, run each as a task, stop on DISC or EOF.
async fn transmit<S: Socket>(wire: Wire<S>, session: Session, cfg: NbdConfig) -> io::Result<()> {
    let Session { export, structured } = session;
    let Wire { stream, mut rbuf } = wire;
    let (rd, wr) = stream.into_split();
    let mut wire = Wire {
        stream: rd,
        rbuf: std::mem::take(&mut rbuf),
    };
    let replies = Rc::new(Replies {
        buf: RefCell::new(BytesMut::with_capacity(READ_SPARE_MIN)),
        bell: Doorbell::default(),
        closing: Cell::new(false),
        failed: Cell::new(false),
        structured,
        executing: Cell::new(0),
        unsent: Cell::new(0),
        room: Doorbell::default(),
        progress: Cell::new(0),
    });
    let stall = cfg.handshake_timeout;
    let writer = carmine_reactor::spawn(write_replies(replies.clone(), wr, stall));
    let mut watch = ReadWatch {
        dog: Watchdog::new(cfg.idle_timeout.map_or(stall, |idle| idle.min(stall))),
        stall,
        idle: cfg.idle_timeout,
    };
    let export = Rc::new(export);
    let permits = Arc::new(Semaphore::new(cfg.inflight_max));
    let outcome = loop {
        let header = match wire
            .take_watched(REQUEST_HEADER_LEN, false, &mut watch, &replies)
            .await
        {
            Ok(h) => h,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e),
        };
        let req = match parse_request(&header) {
            Ok(r) => r,
            Err(e) => break Err(protocol_err(e)),
        };
        if req.cmd == CMD_DISC {
            break Ok(());
        }
        if req.cmd == CMD_WRITE && req.len > PAYLOAD_LEN_MAX {
            // The payload cannot be skipped safely: end the connection, as the spec allows.
            break Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("write of {} bytes is too large", req.len),
            ));
        }
        if req.cmd == CMD_READ && req.len > PAYLOAD_LEN_MAX {
            replies.push(&req, EOVERFLOW, None);
            continue;
        }
        // The byte budget: a request is admitted when what the connection holds leaves room
        // for it (or holds nothing, so any legal request gets through alone). The payload is
        // read only after that, so it counts before it is in memory.
        let cost = match req.cmd {
            CMD_READ | CMD_WRITE => req.len as usize,
            _ => 0,
        } + REPLY_OVERHEAD;
        while replies.held() > 0 && replies.held() + cost > cfg.connection_bytes_max {
            if replies.failed.get() {
                break;
            }
            replies.room.wait().await;
        }
        if replies.failed.get() {
            break Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "replies can no longer be sent",
            ));
        }
        replies.executing.set(replies.executing.get() + cost);
        cfg.stats
            .held_bytes_max
            .fetch_max(replies.held() as u64, Ordering::Relaxed);
        // A write whose payload never fully arrives is never started.
        let payload = if req.cmd == CMD_WRITE {
            match wire
                .take_watched(req.len as usize, true, &mut watch, &replies)
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    replies.executing.set(replies.executing.get() - cost);
                    match e.kind() {
                        io::ErrorKind::UnexpectedEof => break Ok(()),
                        _ => break Err(e),
                    }
                }
            }
        } else {
            Bytes::new()
        };
        let permit = permits.acquire_arc().await;
        let (export, replies) = (export.clone(), replies.clone());
        let fut = async move {
            execute(&export, req, payload, &replies).await;
            replies.executing.set(replies.executing.get() - cost);
            replies.progress.set(replies.progress.get() + 1);
            replies.room.ring();
            drop(permit);
        };
        carmine_reactor::spawn(fut).detach();
    };
    // Let every started request finish and queue its reply before closing.
    let mut all = Vec::with_capacity(cfg.inflight_max);
    for _ in 0..cfg.inflight_max {
        all.push(permits.acquire_arc().await);
    }
    replies.closing.set(true);
    replies.bell.ring();
    let _ = writer.await;
    outcome
}
