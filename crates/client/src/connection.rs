//! One pipelined connection to one OSD reactor endpoint.

use crate::error::ClientError;
use bytes::BytesMut;
use carmine_proto::{encode_request, try_decode_frame, Frame, FrameKind, Request, Response};
use carmine_reactor::io::{read_some, write_all};
use carmine_reactor::Doorbell;
use carmine_reactor::TcpStream;
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;

/// Receive buffer growth step; one read takes in many pipelined replies.
const READ_SPARE_MIN: usize = 256 * 1024;

type Reply = Result<Frame, ClientError>;

pub struct Connection {
    addr: SocketAddr,
    /// Encoded requests not yet handed to the socket.
    out: RefCell<BytesMut>,
    doorbell: Doorbell,
    pending: RefCell<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: Cell<u64>,
    failed: RefCell<Option<String>>,
    permits: async_lock::Semaphore,
    /// Replies received so far: the client's watchdog compares it between ticks to spot a
    /// connection that has requests out and hears nothing back (a partitioned or hung OSD,
    /// which TCP alone reports only after many minutes).
    replies: Cell<u64>,
}

impl Connection {
    pub async fn open(addr: SocketAddr, inflight_max: usize) -> Result<Rc<Self>, ClientError> {
        Self::open_with(addr, inflight_max, None).await
    }

    /// Like [`Connection::open`], first authenticating with `key` if given.
    pub async fn open_with(
        addr: SocketAddr,
        inflight_max: usize,
        key: Option<&carmine_proto::auth::AuthKey>,
    ) -> Result<Rc<Self>, ClientError> {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|source| ClientError::Connect { addr, source })?;
        // Connecting to a local port nobody listens on can pick that very port as the source
        // and connect the socket to itself (TCP simultaneous open). Such a "connection" echoes
        // requests back and holds the port the OSD needs to come back on: refuse it.
        if stream.local_addr().ok() == Some(addr) {
            return Err(ClientError::Connect {
                addr,
                source: std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "connected to itself: nothing listens there",
                ),
            });
        }
        let _ = stream.set_nodelay(true);
        if let Some(key) = key {
            crate::auth::handshake(&mut stream, addr, key).await?;
        }
        let (rd, wr) = stream.into_split();
        let conn = Rc::new(Connection {
            addr,
            out: RefCell::new(BytesMut::with_capacity(READ_SPARE_MIN)),
            doorbell: Doorbell::default(),
            pending: RefCell::new(HashMap::with_capacity(inflight_max)),
            next_id: Cell::new(1),
            failed: RefCell::new(None),
            permits: async_lock::Semaphore::new(inflight_max),
            replies: Cell::new(0),
        });
        carmine_reactor::spawn(read_loop(conn.clone(), rd)).detach();
        carmine_reactor::spawn(write_loop(conn.clone(), wr)).detach();
        Ok(conn)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn is_usable(&self) -> bool {
        self.failed.borrow().is_none()
    }

    /// Closes the connection; requests still in flight fail with `Disconnected`.
    pub fn close(&self) {
        self.fail("closed by the client".into());
    }

    /// Requests awaiting a reply, and replies received so far.
    pub fn progress(&self) -> (usize, u64) {
        (self.pending.borrow().len(), self.replies.get())
    }

    /// Closes the connection for `reason`, which the requests in flight fail with (as
    /// `Disconnected` and in doubt: they may be resent).
    pub fn fail(&self, reason: String) {
        let addr = self.addr;
        self.fail_with(reason.clone(), || ClientError::Disconnected {
            addr,
            reason: reason.clone(),
            in_doubt: true,
        });
    }

    /// Closes the connection because it answered nothing for `waited` while its OSD is up:
    /// the requests in flight fail with `TimedOut`, which is not resent (the OSD may still
    /// apply them).
    pub fn time_out(&self, waited: std::time::Duration) {
        let addr = self.addr;
        self.fail_with(format!("no reply for {waited:?}"), || {
            ClientError::TimedOut { addr, waited }
        });
    }

    fn fail_with(&self, reason: String, error: impl Fn() -> ClientError) {
        if self.failed.borrow().is_some() {
            return;
        }
        *self.failed.borrow_mut() = Some(reason);
        // These requests were handed to the connection: whether the server applied them is
        // unknown.
        for (_, tx) in self.pending.borrow_mut().drain() {
            let _ = tx.send(Err(error()));
        }
        self.doorbell.ring();
    }

    fn disconnected(&self, in_doubt: bool) -> ClientError {
        let reason = self
            .failed
            .borrow()
            .clone()
            .unwrap_or_else(|| "reply channel dropped".into());
        ClientError::Disconnected {
            addr: self.addr,
            reason,
            in_doubt,
        }
    }

    /// Sends `req` and waits for its reply. Waits first if `inflight_max` requests are out.
    pub async fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let _permit = self.permits.acquire().await;
        if !self.is_usable() {
            return Err(self.disconnected(false));
        }
        let id = self.next_id.get();
        self.next_id.set(id.wrapping_add(1));
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(id, tx);
        encode_request(&mut self.out.borrow_mut(), id, req);
        self.doorbell.ring();
        let frame = rx.await.map_err(|_| self.disconnected(true))??;
        match Response::decode(&frame) {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(reply)) => Err(ClientError::Server(reply)),
            Err(e) => Err(ClientError::Protocol {
                addr: self.addr,
                detail: e.to_string(),
            }),
        }
    }
}

async fn write_loop(conn: Rc<Connection>, mut stream: TcpStream) {
    loop {
        conn.doorbell.wait().await;
        loop {
            if !conn.is_usable() {
                let _ = carmine_reactor::io::shutdown_write(&mut stream).await;
                return;
            }
            let batch = std::mem::take(&mut *conn.out.borrow_mut());
            if batch.is_empty() {
                *conn.out.borrow_mut() = batch;
                break;
            }
            let (res, spare) = write_all(&mut stream, batch).await;
            if let Err(e) = res {
                conn.fail(format!("write: {e}"));
                return;
            }
            let mut out = conn.out.borrow_mut();
            if out.is_empty() {
                *out = spare;
            }
        }
    }
}

async fn read_loop(conn: Rc<Connection>, mut stream: TcpStream) {
    let mut buf = BytesMut::with_capacity(READ_SPARE_MIN);
    loop {
        loop {
            match try_decode_frame(&mut buf) {
                Ok(Some(frame)) if frame.header.kind != FrameKind::Response => {
                    conn.fail(format!(
                        "a {:?} frame instead of a reply",
                        frame.header.kind
                    ));
                    return;
                }
                Ok(Some(frame)) => {
                    let Some(tx) = conn.pending.borrow_mut().remove(&frame.header.request_id)
                    else {
                        conn.fail(format!(
                            "reply to unknown request {}",
                            frame.header.request_id
                        ));
                        return;
                    };
                    conn.replies.set(conn.replies.get() + 1);
                    let _ = tx.send(Ok(frame));
                }
                Ok(None) => break,
                Err(e) => {
                    conn.fail(format!("bad frame from server: {e}"));
                    return;
                }
            }
        }
        if !conn.is_usable() {
            return;
        }
        let (res, b) = read_some(&mut stream, buf, READ_SPARE_MIN).await;
        buf = b;
        match res {
            Ok(0) => {
                conn.fail("server closed the connection".into());
                return;
            }
            Ok(_) => {}
            Err(e) => {
                conn.fail(format!("read: {e}"));
                return;
            }
        }
    }
}
