//! One reactor: accepts connections on its endpoint and serves the PGs it owns from its own
//! store shard. Everything here runs on a single pinned thread; shared state is `Rc`.

use crate::daemon::StoreConfig;
use crate::handler::handle_frame;
use bytes::BytesMut;
use carmine_cluster::OsdMap;
use carmine_proto::try_decode_frame;
use carmine_reactor::io::{read_some, write_all};
use carmine_reactor::{Mailbox, TcpListener, TcpStream};
use carmine_store::{MemStore, MemStoreConfig, ObjectStore, Transaction};
use carmine_types::{OsdId, PgId};
use futures::future::{select, Either};
use std::cell::Cell;
use std::collections::HashSet;
use std::rc::Rc;

/// Messages from the control thread to a reactor.
#[derive(Debug)]
pub enum ControlMsg {
    Shutdown,
}

pub(crate) struct ReactorSetup {
    pub osd: OsdId,
    pub index: u32,
    pub map: OsdMap,
    pub store: StoreConfig,
    pub listener: std::net::TcpListener,
    pub control: Mailbox<ControlMsg>,
    pub connections_max: u64,
}

/// Everything one reactor owns.
pub(crate) struct Shard<S> {
    pub osd: OsdId,
    pub index: u32,
    pub map: OsdMap,
    pub encoded_map: bytes::Bytes,
    pub owned: HashSet<PgId>,
    pub store: S,
    pub connections: Cell<u64>,
}

/// Receive buffer growth step: one read can pull in many pipelined requests.
const READ_SPARE_MIN: usize = 256 * 1024;
/// Replies are flushed once this much is pending, even if more requests are buffered, to
/// bound per-connection memory.
const WRITE_FLUSH_BYTES: usize = 1024 * 1024;

pub(crate) async fn run_reactor(setup: ReactorSetup) -> Result<(), String> {
    match setup.store.clone() {
        StoreConfig::Memory { memory_limit_bytes } => {
            let store = MemStore::new(MemStoreConfig { memory_limit_bytes });
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
        ..
    } = setup;
    let listener = TcpListener::from_std(listener).map_err(|e| format!("listener: {e}"))?;
    let pgs = map.pgs_of_reactor(osd, index);
    let mut txn = Transaction::with_capacity(pgs.len());
    for pg in &pgs {
        txn.create_collection(*pg);
    }
    store
        .submit(txn)
        .await
        .map_err(|e| format!("creating PG collections: {e}"))?;
    tracing::info!(osd, reactor = index, pgs = pgs.len(), "reactor serving");
    let shard = Rc::new(Shard {
        osd,
        index,
        encoded_map: map.encode(),
        map,
        owned: pgs.into_iter().collect(),
        store,
        connections: Cell::new(0),
    });
    loop {
        let accept = std::pin::pin!(listener.accept());
        let ctl = std::pin::pin!(control.recv());
        match select(accept, ctl).await {
            Either::Left((Ok((stream, peer)), _)) => {
                if shard.connections.get() >= connections_max {
                    // Each connection may hold a few MiB of buffers: refuse rather than grow.
                    tracing::warn!(%peer, "refusing connection: {connections_max} already open");
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let shard = shard.clone();
                shard.connections.set(shard.connections.get() + 1);
                carmine_reactor::spawn(async move {
                    if let Err(e) = serve_connection(&shard, stream).await {
                        tracing::info!(%peer, "connection closed: {e}");
                    }
                    shard.connections.set(shard.connections.get() - 1);
                })
                .detach();
            }
            Either::Left((Err(e), _)) => {
                // Out of file descriptors and the like: keep serving existing connections.
                tracing::warn!("accept failed: {e}");
                carmine_reactor::sleep(std::time::Duration::from_millis(10)).await;
            }
            Either::Right((Some(ControlMsg::Shutdown) | None, _)) => break,
        }
    }
    tracing::info!(osd, reactor = index, "reactor stopping");
    Ok(())
}

/// Serves one connection: decode every complete request in the receive buffer, append the
/// replies to one send buffer, write them with one call, read again. Pipelined clients thus
/// get batched reads and writes without any per-request syscall.
async fn serve_connection<S: ObjectStore>(
    shard: &Shard<S>,
    mut stream: TcpStream,
) -> Result<(), String> {
    let mut rbuf = BytesMut::with_capacity(READ_SPARE_MIN);
    let mut wbuf = BytesMut::with_capacity(READ_SPARE_MIN);
    loop {
        loop {
            match try_decode_frame(&mut rbuf) {
                Ok(Some(frame)) => handle_frame(shard, frame, &mut wbuf).await,
                Ok(None) => break,
                // The stream can no longer be trusted: drop this connection only.
                Err(e) => {
                    flush(&mut stream, &mut wbuf).await?;
                    return Err(format!("bad frame: {e}"));
                }
            }
            if wbuf.len() >= WRITE_FLUSH_BYTES {
                flush(&mut stream, &mut wbuf).await?;
            }
        }
        flush(&mut stream, &mut wbuf).await?;
        let (res, buf) = read_some(&mut stream, rbuf, READ_SPARE_MIN).await;
        rbuf = buf;
        match res {
            Ok(0) if rbuf.is_empty() => return Ok(()),
            Ok(0) => {
                return Err(format!(
                    "peer closed mid-frame with {} bytes pending",
                    rbuf.len()
                ))
            }
            Ok(_) => {}
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

async fn flush(stream: &mut TcpStream, wbuf: &mut BytesMut) -> Result<(), String> {
    if wbuf.is_empty() {
        return Ok(());
    }
    let (res, buf) = write_all(stream, std::mem::take(wbuf)).await;
    *wbuf = buf;
    res.map_err(|e| format!("write: {e}"))
}
