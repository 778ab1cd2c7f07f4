//! The object client: map-driven routing and pipelined connections.
//!
//! Key decisions: a `Client` lives on one reactor thread (`Rc`, no locks), computes each
//! object's PG and owning OSD reactor from the cluster map, and keeps one connection per
//! reactor endpoint. Each connection pipelines up to `inflight_max` requests: callers encode
//! into a shared send buffer and a single writer task flushes everything queued with one
//! write, while a reader task matches replies to callers by request id. A `WrongTarget` reply
//! makes the client refetch the map and retry.
//!
//! Connection failures (an OSD restarting) are retried too, so that a caller sees a stall
//! rather than an error: the client reconnects with exponential backoff, re-reads the map, and
//! resends the request, until `ClientConfig::retry_timeout` has passed since the first failure.
//! A request that never reached the socket is always resent. One that was sent before the
//! connection broke is *in doubt*, and is resent only if all its ops are idempotent
//! (`OsdOp::is_idempotent`: reads, and writes that set bytes at an offset, a size, attributes
//! or keys); otherwise the failure goes to the caller, who knows what the op meant. This
//! relies on the in-doubt attempt not being applied after the resent one, which holds when the
//! connection broke because the OSD process died.
//!
//! A connection can also stay open and go silent: the OSD's host was cut off, or the process
//! hangs, and TCP would report it only after many minutes. A watchdog task looks at every
//! connection each `WATCH_TICK`; one with requests out and no reply for a tick is asked for
//! its map on that connection, and if it does not answer either, the client re-reads the map
//! from the other OSDs and closes the connection once the map says that OSD is down: its PGs
//! have new primaries and the requests on it retry as above. One still up in the map and
//! silent for `retry_timeout` is closed too, but its requests fail as `TimedOut` (in doubt,
//! not resent): the OSD may still apply them, after a resend and a later write would be. A
//! retry is given only what is left of the retry timeout.

mod auth;
pub use auth::handshake_as;
mod connection;
mod error;

pub use auth::CLIENT_ENTITY;
pub use connection::Connection;
pub use error::ClientError;

use bytes::Bytes;
use carmine_cluster::OsdMap;
use carmine_proto::{ObjectRequest, OpOutput, OsdOp, Request, Response, Status};
use carmine_types::{PgId, PoolId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Default for [`ClientConfig::connect_timeout`]. An OSD on the same network completes the
/// TCP and authentication handshakes in milliseconds even when busy (the kernel answers the
/// SYN); an address that has not answered in a second is most likely cut off, and the request
/// is better off re-reading the map than waiting on it. A lost SYN costs one retry.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);

/// How often the client looks for connections with requests out and no reply since the last
/// look.
const WATCH_TICK: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Requests in flight per connection before callers wait (back-pressure).
    pub inflight_max: usize,
    /// How often a `WrongTarget` reply triggers a map refresh and retry before giving up.
    pub retries_max: u32,
    /// How long a request keeps retrying after its OSD became unreachable (connection refused
    /// or lost) before the error goes to the caller (as `ClientError::Unavailable`). Zero: no
    /// retries.
    pub retry_timeout: Duration,
    /// The first pause between attempts while an OSD is unreachable; it doubles after each
    /// failed attempt up to `retry_backoff_max`.
    pub retry_backoff_min: Duration,
    pub retry_backoff_max: Duration,
    /// How long one attempt to open a connection may take. Refused connections (the OSD
    /// process is gone) fail at once; this bounds a connect to an address that does not
    /// answer at all (a host cut off or down).
    pub connect_timeout: Duration,
    /// The cluster key: every connection starts with the handshake that proves this client
    /// and the OSD both hold it. `None` for clusters without authentication.
    pub key: Option<carmine_proto::auth::AuthKey>,
    /// Speak as an existing client instance instead of a new random one: the clients of
    /// one process's several reactor threads that share an image lock (and are fenced
    /// together). Each must have its own `lane`, which keeps their request ids apart.
    pub instance: Option<SharedInstance>,
}

/// One client instance spoken for by several [`Client`]s, one per reactor thread. The
/// instance is what an image lock names and what a fence shuts out; a request's id is its
/// instance and tid, so each client numbers its tids in its own lane (the top byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedInstance {
    /// Never 0 ("anonymous" on the wire).
    pub id: u64,
    pub lane: u8,
}

/// The bits of a tid below its lane.
const TID_LANE_SHIFT: u32 = 56;

/// Default for [`ClientConfig::retry_timeout`]: longer than an OSD takes to restart.
pub const RETRY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            inflight_max: 1024,
            retries_max: 3,
            retry_timeout: RETRY_TIMEOUT_DEFAULT,
            retry_backoff_min: Duration::from_millis(10),
            retry_backoff_max: Duration::from_secs(1),
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            key: None,
            instance: None,
        }
    }
}

/// A handle to the cluster, cheap to clone within its thread.
#[derive(Clone)]
pub struct Client {
    inner: Rc<Inner>,
}

struct Inner {
    cfg: ClientConfig,
    /// This client instance, sent with every object request: what a fence names.
    instance: u64,
    bootstrap: Vec<SocketAddr>,
    map: RefCell<Rc<OsdMap>>,
    /// Where each PG's requests go in `map`'s epoch (`None`: the PG has no primary), filled
    /// as PGs are used and emptied when the map changes: placement (a sort over the OSDs, a
    /// weighted draw each when weights differ) runs once per PG and epoch, not per request.
    routes: RefCell<HashMap<PgId, Option<SocketAddr>>>,
    conns: RefCell<HashMap<SocketAddr, Endpoint>>,
    /// The number of the last object request: every retry of one carries the same. Its top
    /// byte is this client's lane of a shared instance (0 otherwise).
    last_tid: std::cell::Cell<u64>,
    /// Held during a map refresh: the many requests that want one at the same moment (an OSD
    /// went away under all of them) share it instead of asking the cluster once each.
    refreshing: async_lock::Mutex<()>,
    /// Map refreshes finished so far (tells a request that waited behind one that it is done).
    refreshes: std::cell::Cell<u64>,
}

/// What the client knows about one OSD reactor endpoint.
#[derive(Default)]
struct Endpoint {
    conn: Option<Rc<Connection>>,
    /// Held while a connection is being opened, so that the many requests that find the
    /// connection broken open one new connection, not one each.
    opening: Rc<async_lock::Mutex<()>>,
    /// Failed attempts to open a connection so far, and why the last one failed: requests that
    /// waited behind a failed attempt take its result instead of trying again at once.
    open_failures: u64,
    last_open_error: Option<OpenFailure>,
    /// When opening a connection first failed, until one opens again: the outage is logged
    /// once per endpoint, not once per waiting request.
    down_since: Option<Instant>,
    /// The reply count and time at which the watchdog saw the open connection with requests
    /// out, while no reply came since; `None` while it is idle or replies keep coming.
    quiet_since: Option<(u64, Instant)>,
    /// Requests out and no reply for at least a watchdog tick: a map refresh does not wait
    /// on this connection.
    silent: bool,
}

/// Why the last attempt to open a connection failed, as the requests that waited behind it
/// get it: a refused handshake stays an authentication error (not retried), anything else is
/// a connection failure (retried while the OSD may be restarting).
#[derive(Clone)]
enum OpenFailure {
    Io(std::io::ErrorKind, String),
    Auth(String),
}

impl OpenFailure {
    fn of(e: &ClientError) -> Self {
        match e {
            ClientError::Connect { source, .. } => {
                OpenFailure::Io(source.kind(), source.to_string())
            }
            ClientError::Auth { detail, .. } => OpenFailure::Auth(detail.clone()),
            other => OpenFailure::Io(std::io::ErrorKind::Other, other.to_string()),
        }
    }

    fn error(self, addr: SocketAddr) -> ClientError {
        match self {
            OpenFailure::Io(kind, msg) => ClientError::Connect {
                addr,
                source: std::io::Error::new(kind, msg),
            },
            OpenFailure::Auth(detail) => ClientError::Auth { addr, detail },
        }
    }
}

impl Endpoint {
    fn usable(&self) -> Option<Rc<Connection>> {
        self.conn.as_ref().filter(|c| c.is_usable()).cloned()
    }

    /// Notes this tick's look at the connection; returns for how long it has had requests
    /// out and heard nothing, if it has for a tick or more.
    fn watch(&mut self, now: Instant) -> Option<Duration> {
        let progress = self.usable().map(|c| c.progress());
        let quiet = match (progress, self.quiet_since) {
            (Some((out, replies)), Some((seen, since))) if out > 0 && seen == replies => {
                Some(now - since)
            }
            (Some((out, replies)), _) if out > 0 => {
                self.quiet_since = Some((replies, now));
                None
            }
            _ => {
                self.quiet_since = None;
                None
            }
        };
        self.silent = quiet.is_some();
        quiet
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for c in self.conns.borrow().values().filter_map(|e| e.conn.as_ref()) {
            c.close();
        }
    }
}

/// How many OSDs a map refresh asks at most when none has a newer map.
const REFRESH_ANSWERS_MAX: usize = 3;

impl Client {
    /// Connects to any reachable address in `bootstrap` and fetches the cluster map from it.
    pub async fn connect(
        bootstrap: &[SocketAddr],
        cfg: ClientConfig,
    ) -> Result<Client, ClientError> {
        Self::connect_with_map(bootstrap, None, cfg).await
    }

    /// Like [`Client::connect`], starting from `map` (read from the map store, say): the
    /// client then never routes by an older epoch than it, even if the first OSD it asks has
    /// not caught up yet, and OSDs behind it wait for it before serving its requests.
    pub async fn connect_with_map(
        bootstrap: &[SocketAddr],
        map: Option<OsdMap>,
        cfg: ClientConfig,
    ) -> Result<Client, ClientError> {
        let (instance, lane) = match cfg.instance {
            Some(SharedInstance { id: 0, .. }) => {
                return Err(ClientError::Config(
                    "client instance 0 is the anonymous client".into(),
                ))
            }
            Some(s) => (s.id, s.lane),
            // Never 0, which means "anonymous" on the wire.
            None => (rand::random::<u64>() | 1, 0),
        };
        let client = Client {
            inner: Rc::new(Inner {
                cfg,
                instance,
                bootstrap: bootstrap.to_vec(),
                map: RefCell::new(Rc::new(map.unwrap_or(OsdMap {
                    epoch: 0,
                    osds: vec![],
                    pools: vec![],
                    upmaps: Default::default(),
                    pg_temp: Default::default(),
                    pool_max: 0,
                    given_copies: Default::default(),
                }))),
                routes: RefCell::new(HashMap::new()),
                conns: RefCell::new(HashMap::new()),
                last_tid: std::cell::Cell::new(u64::from(lane) << TID_LANE_SHIFT),
                refreshing: async_lock::Mutex::new(()),
                refreshes: std::cell::Cell::new(0),
            }),
        };
        client.refresh_map().await?;
        carmine_reactor::spawn(watch_connections(Rc::downgrade(&client.inner))).detach();
        Ok(client)
    }

    /// This client instance's id: what [`Client::fence`] takes to shut it out.
    pub fn instance(&self) -> u64 {
        self.inner.instance
    }

    /// Makes every OSD reactor in the map refuse object requests from client `instance`
    /// (`Status::Fenced`) from now on, durably. Returns only once every reactor confirmed:
    /// then no request of that client can still apply anywhere. An unreachable OSD fails the
    /// fence, since it could otherwise apply the fenced client's requests once it is back.
    pub async fn fence(&self, instance: u64) -> Result<(), ClientError> {
        let map = self.map();
        let addrs: Vec<SocketAddr> = map
            .osds
            .iter()
            .flat_map(|o| o.reactors.iter().copied())
            .collect();
        let req = Request::Fence { client: instance };
        let results = futures::future::join_all(addrs.iter().map(|a| self.call(*a, &req))).await;
        for (addr, res) in addrs.iter().zip(results) {
            match res {
                Ok(Response::Fenced) => {}
                Ok(other) => return Err(ClientError::unexpected(*addr, &other)),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Scrubs PG `seed` of `pool` at its primary, which compares every member's copy of
    /// each object (and with a repair rewrites the bad ones), and returns its report. A PG
    /// still peering is waited for like an outage; a scrub that already runs is refused.
    pub async fn scrub(
        &self,
        pool: PoolId,
        seed: u32,
        mode: carmine_proto::ScrubMode,
    ) -> Result<carmine_proto::ScrubReport, ClientError> {
        let req = |epoch| Request::Scrub {
            pool,
            pg_seed: seed,
            epoch,
            mode,
        };
        match self.call_primary(pool, seed, req, true).await? {
            (_, Response::Scrubbed(r)) => Ok(r),
            (addr, other) => Err(ClientError::unexpected(addr, &other)),
        }
    }

    /// At the primary of PG `seed` of `pool`, which waits for objects no reachable copy holds:
    /// gives them up (deletes them from the PG's history) so the PG goes active without them.
    /// Returns how many it gave up; a PG that waits for no unfound object answers
    /// `InvalidArgument`. The operator's decision, never the client's.
    pub async fn mark_unfound_lost(&self, pool: PoolId, seed: u32) -> Result<u64, ClientError> {
        let req = |epoch| Request::MarkUnfoundLost {
            pool,
            pg_seed: seed,
            epoch,
        };
        match self.call_primary(pool, seed, req, false).await? {
            (_, Response::MarkedLost { objects }) => Ok(objects),
            (addr, other) => Err(ClientError::unexpected(addr, &other)),
        }
    }

    /// Sends the operator request `req(epoch)` to the primary of PG `seed` of `pool` as the
    /// map names it, following the map when the OSD says it is not the target, and waiting
    /// out an outage (also a PG that is not active, if `inactive_is_outage`). Returns the
    /// answer and who gave it.
    async fn call_primary(
        &self,
        pool: PoolId,
        seed: u32,
        req: impl Fn(u32) -> Request,
        inactive_is_outage: bool,
    ) -> Result<(SocketAddr, Response), ClientError> {
        let pg = carmine_types::PgId { pool, seed };
        let mut outage = None;
        let mut attempt = 0;
        loop {
            let map = self.map();
            let addr = match map
                .pg_primary(pg)
                .and_then(|(osd, r)| Some(map.osd(osd)?.reactors[r as usize]))
            {
                Some(a) => a,
                None => {
                    self.wait_in_outage(&mut outage, ClientError::NoOsd { pg })
                        .await?;
                    continue;
                }
            };
            match self.call(addr, &req(map.epoch)).await {
                Ok(resp) => return Ok((addr, resp)),
                Err(e)
                    if e.status() == Some(Status::WrongTarget)
                        && attempt < self.inner.cfg.retries_max =>
                {
                    attempt += 1;
                    self.refresh_map().await?;
                }
                Err(e)
                    if e.is_connection_failure()
                        || (inactive_is_outage && e.status() == Some(Status::PgInactive)) =>
                {
                    self.wait_in_outage(&mut outage, e).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The map this client routes by.
    pub fn map(&self) -> Rc<OsdMap> {
        self.inner.map.borrow().clone()
    }

    /// Fetches the map again from the bootstrap addresses, then from any known up OSD: takes
    /// the first newer map, or gives up after a few answers that had none newer (OSDs learn
    /// new epochs at their own pace, so one stale answer is not the last word). Addresses that
    /// failed to connect are asked last, open connections that went silent not at all, and no
    /// answer is awaited for longer than twice the connect timeout. A refresh already under
    /// way is joined, not repeated.
    pub async fn refresh_map(&self) -> Result<(), ClientError> {
        let done = self.inner.refreshes.get();
        let _one = self.inner.refreshing.lock().await;
        if self.inner.refreshes.get() != done {
            return Ok(());
        }
        let res = self.ask_for_newer_map().await;
        self.inner.refreshes.set(done + 1);
        res
    }

    async fn ask_for_newer_map(&self) -> Result<(), ClientError> {
        let map = self.map();
        let known = map
            .osds
            .iter()
            .filter(|o| o.up)
            .flat_map(|o| o.reactors.iter().copied());
        let mut candidates: Vec<SocketAddr> =
            self.inner.bootstrap.iter().copied().chain(known).collect();
        let mut tried = std::collections::HashSet::new();
        candidates.retain(|a| tried.insert(*a));
        {
            // An open connection that went silent will not answer this either; one that
            // failed to open may open now, but is asked after the others.
            let conns = self.inner.conns.borrow();
            candidates.retain(|a| {
                !conns
                    .get(a)
                    .is_some_and(|ep| ep.silent && ep.usable().is_some())
            });
            candidates.sort_by_key(|a| conns.get(a).is_some_and(|ep| ep.down_since.is_some()));
        }
        let patience = self.inner.cfg.connect_timeout * 2;
        let mut last_err = ClientError::NoAddress;
        let mut answers = 0;
        for addr in candidates {
            let answer = carmine_reactor::timeout(patience, self.call(addr, &Request::GetMap))
                .await
                .unwrap_or_else(|_| Err(timed_out(addr, format!("no map within {patience:?}"))));
            match answer {
                Ok(Response::Map { encoded }) => {
                    let map = OsdMap::decode(encoded).map_err(ClientError::Map)?;
                    if self.adopt_if_newer(map) {
                        return Ok(());
                    }
                    answers += 1;
                    if answers == REFRESH_ANSWERS_MAX {
                        return Ok(());
                    }
                }
                Ok(other) => last_err = ClientError::unexpected(addr, &other),
                Err(e) => last_err = e,
            }
        }
        if answers > 0 {
            return Ok(());
        }
        Err(last_err)
    }

    /// Routes by `map` from now on if it is newer than the current one.
    fn adopt_if_newer(&self, map: OsdMap) -> bool {
        if map.epoch <= self.map().epoch {
            return false;
        }
        *self.inner.map.borrow_mut() = Rc::new(map);
        self.inner.routes.borrow_mut().clear();
        true
    }

    /// One look of the watchdog. A connection that has had requests out and no reply for a
    /// tick is asked for its map, on that very connection: an OSD that is only slow answers
    /// (and may have a newer map), a cut-off or hung one does not. For those the client
    /// re-reads the map from the others and closes the connection if the map says the OSD is
    /// down (or no longer lists it), so that its requests fail over to the PGs' new primaries
    /// instead of waiting for TCP to give up; or once it has been silent for `retry_timeout`,
    /// failing its requests as `TimedOut`.
    async fn close_silent_connections(&self) {
        let now = Instant::now();
        let silent: Vec<(SocketAddr, Rc<Connection>, Duration)> = self
            .inner
            .conns
            .borrow_mut()
            .iter_mut()
            .filter_map(|(a, ep)| {
                let quiet = ep.watch(now)?;
                Some((*a, ep.usable()?, quiet))
            })
            .collect();
        if silent.is_empty() {
            return;
        }
        let patience = self.inner.cfg.connect_timeout;
        let probes = silent
            .iter()
            .map(|(_, conn, _)| carmine_reactor::timeout(patience, conn.call(&Request::GetMap)));
        let answers = futures::future::join_all(probes).await;
        let mut unanswered = Vec::new();
        for ((addr, conn, quiet), answer) in silent.into_iter().zip(answers) {
            match answer {
                Ok(Ok(Response::Map { encoded })) => {
                    if let Ok(map) = OsdMap::decode(encoded) {
                        self.adopt_if_newer(map);
                    }
                }
                _ => unanswered.push((addr, conn, quiet + patience)),
            }
        }
        if unanswered.is_empty() {
            return;
        }
        if let Err(e) = self.refresh_map().await {
            tracing::debug!("map refresh for silent connections: {e}");
        }
        let map = self.map();
        let retry_timeout = self.inner.cfg.retry_timeout;
        for (addr, conn, quiet) in unanswered {
            let reason = match map.osds.iter().find(|o| o.reactors.contains(&addr)) {
                Some(o) if !o.up => format!("osd.{} is down in map epoch {}", o.id, map.epoch),
                None => format!("no OSD has this address in map epoch {}", map.epoch),
                // Up in the map and silent (a hung disk, a link down between this client and
                // it only): its requests may still be applied there, after a resend and a
                // later write to the same place would be. They fail instead, in doubt.
                _ if !retry_timeout.is_zero() && quiet >= retry_timeout => {
                    tracing::warn!("{addr}: no reply for {quiet:?}: closing the connection");
                    conn.time_out(quiet);
                    continue;
                }
                _ => continue,
            };
            // Its PGs have other primaries now, and it serves nothing in this epoch: a resend
            // goes there, and the silent OSD cannot complete the request any more.
            tracing::warn!(
                "{addr}: no reply for {quiet:?} and {reason}: closing the connection, its \
                 requests retry at the new primaries"
            );
            conn.fail(format!("{reason} (no reply for {quiet:?})"));
        }
    }

    pub fn pool_id(&self, name: &str) -> Result<PoolId, ClientError> {
        self.map()
            .pool_by_name(name)
            .map(|p| p.id)
            .map_err(ClientError::Map)
    }

    /// The connection to `addr`, opened on first use and reopened after a failure. Callers that
    /// find it broken at the same time share one attempt to reopen it.
    pub async fn connection(&self, addr: SocketAddr) -> Result<Rc<Connection>, ClientError> {
        let failures_before = {
            let mut conns = self.inner.conns.borrow_mut();
            let ep = conns.entry(addr).or_default();
            if let Some(c) = ep.usable() {
                return Ok(c);
            }
            ep.open_failures
        };
        // Boxed: opening a connection (connect, handshake, timers) is a large state machine,
        // and every request's future would carry its size inline (memcpy'd at each spawn).
        Box::pin(self.open_connection(addr, failures_before)).await
    }

    async fn open_connection(
        &self,
        addr: SocketAddr,
        failures_before: u64,
    ) -> Result<Rc<Connection>, ClientError> {
        let opening = self.inner.conns.borrow()[&addr].opening.clone();
        let _opening = opening.lock().await;
        {
            let conns = self.inner.conns.borrow();
            let ep = conns.get(&addr).expect("endpoints are never removed");
            if let Some(c) = ep.usable() {
                return Ok(c);
            }
            if ep.open_failures != failures_before {
                let failure = ep.last_open_error.clone().expect("set with open_failures");
                return Err(failure.error(addr));
            }
        }
        let connect_timeout = self.inner.cfg.connect_timeout;
        let opened = carmine_reactor::timeout(
            connect_timeout,
            Connection::open_with(
                addr,
                self.inner.cfg.inflight_max,
                self.inner.cfg.key.as_ref(),
            ),
        )
        .await
        .unwrap_or_else(|_| {
            Err(timed_out(
                addr,
                format!("no answer within {connect_timeout:?}"),
            ))
        });
        let mut conns = self.inner.conns.borrow_mut();
        let ep = conns.get_mut(&addr).expect("endpoints are never removed");
        match opened {
            Ok(conn) => {
                if let Some(t) = ep.down_since.take() {
                    tracing::warn!("{addr} is reachable again after {:?}", t.elapsed());
                }
                ep.conn = Some(conn.clone());
                Ok(conn)
            }
            Err(e) => {
                if ep.down_since.is_none() {
                    ep.down_since = Some(Instant::now());
                    tracing::warn!(
                        "{e}; requests wait for it up to {:?}",
                        self.inner.cfg.retry_timeout
                    );
                }
                ep.open_failures += 1;
                ep.last_open_error = Some(OpenFailure::of(&e));
                Err(e)
            }
        }
    }

    /// Sends one request to `addr` and waits for its reply.
    pub async fn call(&self, addr: SocketAddr, req: &Request) -> Result<Response, ClientError> {
        self.connection(addr).await?.call(req).await
    }

    /// Runs `ops` on object `oid` of `pool` at the PG's primary. All ops are reads, or all
    /// are writes applied atomically. While the primary is unreachable the request waits and
    /// is retried as the crate documentation describes, for up to `retry_timeout`.
    pub async fn execute(
        &self,
        pool: PoolId,
        oid: impl Into<String>,
        ops: Vec<OsdOp>,
    ) -> Result<Vec<OpOutput>, ClientError> {
        let mut req = ObjectRequest {
            pool,
            pg_seed: 0,
            epoch: 0,
            client: self.inner.instance,
            tid: {
                let tid = self.inner.last_tid.get() + 1;
                self.inner.last_tid.set(tid);
                tid
            },
            oid: oid.into(),
            ops,
        };
        let idempotent = req.ops.iter().all(OsdOp::is_idempotent);
        // Every await off the common path (an outage, a map refresh, a retry's timer) is
        // boxed: this future is part of every request's, and each spawn copies it whole.
        let mut attempt = 0;
        let mut outage: Option<Outage> = None;
        loop {
            let addr = match self.route(&mut req) {
                Ok(addr) => addr,
                // The PG is down (no OSD of it is up): it waits for one like for an outage.
                Err(e @ ClientError::NoOsd { .. }) => {
                    Box::pin(self.wait_in_outage(&mut outage, e)).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let req_msg = Request::Object(req);
            let res = match &outage {
                None => self.call(addr, &req_msg).await,
                // A retry gets what is left of the retry timeout, and at least a connect
                // timeout (the last attempt must reach the OSD to learn why it fails): an OSD
                // that takes the request and then goes silent must not hold it much past that.
                Some(o) => {
                    let cfg = &self.inner.cfg;
                    let left = (cfg.retry_timeout.saturating_sub(o.since.elapsed()))
                        .max(cfg.connect_timeout);
                    Box::pin(carmine_reactor::timeout(left, self.call(addr, &req_msg)))
                        .await
                        .unwrap_or_else(|_| {
                            Err(ClientError::Disconnected {
                                addr,
                                reason: format!(
                                    "no reply within the retry timeout ({left:?} given)"
                                ),
                                in_doubt: true,
                            })
                        })
                }
            };
            let Request::Object(r) = req_msg else {
                unreachable!()
            };
            req = r;
            match res {
                Ok(Response::Object { outputs }) if outputs.len() == req.ops.len() => {
                    return Ok(outputs)
                }
                Ok(other) => return Err(ClientError::unexpected(addr, &other)),
                Err(e)
                    if e.status() == Some(Status::WrongTarget)
                        && attempt < self.inner.cfg.retries_max =>
                {
                    attempt += 1;
                    tracing::debug!("{e}; refreshing the map (attempt {attempt})");
                    Box::pin(self.refresh_map()).await?;
                }
                Err(e) if e.is_connection_failure() && (idempotent || !e.in_doubt()) => {
                    Box::pin(self.wait_in_outage(&mut outage, e)).await?;
                }
                // The PG is peering or has too few copies up: nothing was applied; it is an
                // outage of the PG. (A replicated PG also answers a retry it already applied
                // from its log, by the request number.)
                Err(e) if e.status() == Some(Status::PgInactive) => {
                    Box::pin(self.wait_in_outage(&mut outage, e)).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One pause of a request that cannot reach its PG (`e` says why), then a map refresh;
    /// `Unavailable` once it has waited `retry_timeout` in all.
    async fn wait_in_outage(
        &self,
        outage: &mut Option<Outage>,
        e: ClientError,
    ) -> Result<(), ClientError> {
        let cfg = &self.inner.cfg;
        let o = outage.get_or_insert_with(|| {
            tracing::debug!("{e}; retrying for up to {:?}", cfg.retry_timeout);
            Outage {
                since: Instant::now(),
                backoff: cfg.retry_backoff_min,
            }
        });
        let waited = o.since.elapsed();
        if waited >= cfg.retry_timeout {
            tracing::warn!("{e}; giving up after {waited:?}");
            return Err(ClientError::Unavailable {
                waited,
                last: Box::new(e),
            });
        }
        tracing::debug!("{e}; next attempt in {:?}", o.backoff);
        carmine_reactor::sleep(o.backoff.min(cfg.retry_timeout - waited)).await;
        o.backoff = (o.backoff * 2).min(cfg.retry_backoff_max);
        // The OSD may come back elsewhere, or its PGs move: route the next attempt by the
        // newest map. Failing to fetch one is expected while the OSD is still down.
        if let Err(e) = self.refresh_map().await {
            tracing::debug!("map refresh during an outage: {e}");
        }
        Ok(())
    }

    /// Fills in the PG and epoch of `req` from the map and returns the owning endpoint.
    fn route(&self, req: &mut ObjectRequest) -> Result<SocketAddr, ClientError> {
        let map = self.map();
        let pool = map.pool(req.pool).map_err(ClientError::Map)?;
        let pg = map.object_pg(pool, &req.oid);
        req.pg_seed = pg.seed;
        req.epoch = map.epoch;
        let cached = self.inner.routes.borrow().get(&pg).copied();
        let target = match cached {
            Some(t) => t,
            None => {
                let t = map
                    .pg_primary(pg)
                    .and_then(|(osd, r)| Some(map.osd(osd)?.reactors[r as usize]));
                self.inner.routes.borrow_mut().insert(pg, t);
                t
            }
        };
        target.ok_or(ClientError::NoOsd { pg })
    }

    pub async fn read(
        &self,
        pool: PoolId,
        oid: &str,
        off: u64,
        len: u32,
    ) -> Result<Bytes, ClientError> {
        match self
            .execute(pool, oid, vec![OsdOp::Read { off, len }])
            .await?
            .pop()
        {
            Some(OpOutput::Data(b)) => Ok(b),
            _ => Err(ClientError::Unexpected {
                detail: "read returned no data".into(),
            }),
        }
    }

    pub async fn write(
        &self,
        pool: PoolId,
        oid: impl Into<String>,
        off: u64,
        data: Bytes,
    ) -> Result<(), ClientError> {
        self.execute(pool, oid, vec![OsdOp::Write { off, data }])
            .await
            .map(drop)
    }

    pub async fn stat(&self, pool: PoolId, oid: &str) -> Result<u64, ClientError> {
        match self.execute(pool, oid, vec![OsdOp::Stat]).await?.pop() {
            Some(OpOutput::Stat { size }) => Ok(size),
            _ => Err(ClientError::Unexpected {
                detail: "stat returned no size".into(),
            }),
        }
    }

    pub async fn remove(&self, pool: PoolId, oid: &str) -> Result<(), ClientError> {
        self.execute(pool, oid, vec![OsdOp::Remove]).await.map(drop)
    }
}

/// An attempt to reach `addr` that took too long, as a connection failure (retried).
fn timed_out(addr: SocketAddr, what: String) -> ClientError {
    ClientError::Connect {
        addr,
        source: std::io::Error::new(std::io::ErrorKind::TimedOut, what),
    }
}

/// Runs [`Client::close_silent_connections`] every tick while the client exists.
async fn watch_connections(inner: std::rc::Weak<Inner>) {
    loop {
        carmine_reactor::sleep(WATCH_TICK).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        Client { inner }.close_silent_connections().await;
    }
}

/// A request's wait for an unreachable OSD.
struct Outage {
    since: Instant,
    /// The pause before the next attempt.
    backoff: Duration,
}
