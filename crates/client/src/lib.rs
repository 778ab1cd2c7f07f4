//! The object client: map-driven routing and pipelined connections.
//!
//! Key decisions: a `Client` lives on one reactor thread (`Rc`, no locks), computes each
//! object's PG and owning OSD reactor from the cluster map, and keeps one connection per
//! reactor endpoint. Each connection pipelines up to `inflight_max` requests: callers encode
//! into a shared send buffer and a single writer task flushes everything queued with one
//! write, while a reader task matches replies to callers by request id. A `WrongTarget` reply
//! makes the client refetch the map and retry.

mod connection;
mod error;

pub use connection::Connection;
pub use error::ClientError;

use bytes::Bytes;
use carmine_cluster::OsdMap;
use carmine_proto::{ObjectRequest, OpOutput, OsdOp, Request, Response, Status};
use carmine_types::PoolId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Requests in flight per connection before callers wait (back-pressure).
    pub inflight_max: usize,
    /// How often a `WrongTarget` reply triggers a map refresh and retry before giving up.
    pub retries_max: u32,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            inflight_max: 1024,
            retries_max: 3,
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
    bootstrap: Vec<SocketAddr>,
    map: RefCell<Rc<OsdMap>>,
    conns: RefCell<HashMap<SocketAddr, Rc<Connection>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for c in self.conns.borrow().values() {
            c.close();
        }
    }
}

impl Client {
    /// Connects to any reachable address in `bootstrap` and fetches the cluster map from it.
    pub async fn connect(
        bootstrap: &[SocketAddr],
        cfg: ClientConfig,
    ) -> Result<Client, ClientError> {
        let client = Client {
            inner: Rc::new(Inner {
                cfg,
                bootstrap: bootstrap.to_vec(),
                map: RefCell::new(Rc::new(OsdMap {
                    epoch: 0,
                    osds: vec![],
                    pools: vec![],
                })),
                conns: RefCell::new(HashMap::new()),
            }),
        };
        client.refresh_map().await?;
        Ok(client)
    }

    /// The map this client routes by.
    pub fn map(&self) -> Rc<OsdMap> {
        self.inner.map.borrow().clone()
    }

    /// Fetches the map again from the bootstrap addresses, then from any known OSD.
    pub async fn refresh_map(&self) -> Result<(), ClientError> {
        let map = self.map();
        let known = map
            .osds
            .iter()
            .filter(|o| o.up)
            .flat_map(|o| o.reactors.iter().copied());
        let candidates: Vec<SocketAddr> =
            self.inner.bootstrap.iter().copied().chain(known).collect();
        let mut last_err = ClientError::NoAddress;
        for addr in candidates {
            match self.call(addr, &Request::GetMap).await {
                Ok(Response::Map { encoded }) => {
                    let map = OsdMap::decode(encoded).map_err(ClientError::Map)?;
                    if map.epoch >= self.map().epoch {
                        *self.inner.map.borrow_mut() = Rc::new(map);
                    }
                    return Ok(());
                }
                Ok(other) => last_err = ClientError::unexpected(addr, &other),
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }

    pub fn pool_id(&self, name: &str) -> Result<PoolId, ClientError> {
        self.map()
            .pool_by_name(name)
            .map(|p| p.id)
            .map_err(ClientError::Map)
    }

    /// The connection to `addr`, opened on first use and reopened after a failure.
    pub async fn connection(&self, addr: SocketAddr) -> Result<Rc<Connection>, ClientError> {
        if let Some(c) = self.inner.conns.borrow().get(&addr) {
            if c.is_usable() {
                return Ok(c.clone());
            }
        }
        let conn = Connection::open(addr, self.inner.cfg.inflight_max).await?;
        self.inner.conns.borrow_mut().insert(addr, conn.clone());
        Ok(conn)
    }

    /// Sends one request to `addr` and waits for its reply.
    pub async fn call(&self, addr: SocketAddr, req: &Request) -> Result<Response, ClientError> {
        self.connection(addr).await?.call(req).await
    }

    /// Runs `ops` on object `oid` of `pool` at the PG's primary. All ops are reads, or all
    /// are writes applied atomically.
    pub async fn execute(
        &self,
        pool: PoolId,
        oid: &str,
        ops: Vec<OsdOp>,
    ) -> Result<Vec<OpOutput>, ClientError> {
        let mut req = ObjectRequest {
            pool,
            pg_seed: 0,
            epoch: 0,
            oid: oid.to_owned(),
            ops,
        };
        let mut attempt = 0;
        loop {
            let addr = self.route(&mut req)?;
            let req_msg = Request::Object(req);
            let res = self.call(addr, &req_msg).await;
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
                    self.refresh_map().await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Fills in the PG and epoch of `req` from the map and returns the owning endpoint.
    fn route(&self, req: &mut ObjectRequest) -> Result<SocketAddr, ClientError> {
        let map = self.map();
        let pool = map.pool(req.pool).map_err(ClientError::Map)?;
        let pg = map.object_pg(pool, &req.oid);
        let (osd, reactor) = map.pg_primary(pg).ok_or(ClientError::NoOsd { pg })?;
        let info = map.osd(osd).ok_or(ClientError::NoOsd { pg })?;
        req.pg_seed = pg.seed;
        req.epoch = map.epoch;
        Ok(info.reactors[reactor as usize])
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
        oid: &str,
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
