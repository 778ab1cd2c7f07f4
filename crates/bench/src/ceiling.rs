//! The loopback RPC ceiling: a trivial server that answers every request with a reply of the
//! size the request asks for (first 4 bytes of its payload), driven by the same client
//! connection code and framing as the real workload. It bounds what any request/response
//! service can reach on this machine and transport.

use crate::workload::{closed_loop, Io, StepStats};
use bytes::{Bytes, BytesMut};
use carmine_client::Connection;
use carmine_proto::{encode_response, try_decode_frame, Request, Response};
use carmine_reactor::io::{read_some, write_all};
use carmine_reactor::{spawn_reactor, TcpListener};
use std::net::SocketAddr;
use std::time::Duration;

const READ_SPARE_MIN: usize = 256 * 1024;

/// Largest reply the trivial server sends.
const REPLY_LEN_MAX: usize = 1 << 20;

fn reply_len(req: &Request) -> usize {
    match req {
        Request::Ping { payload } if payload.len() >= 4 => {
            (u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")) as usize)
                .min(REPLY_LEN_MAX)
        }
        _ => 0,
    }
}

/// Starts the trivial server on its own pinned thread; it serves until the process exits.
pub fn start_server(cpu: Option<u32>) -> anyhow::Result<SocketAddr> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let zeros = Bytes::from(vec![0u8; REPLY_LEN_MAX]);
    spawn_reactor("rpc-ceiling".into(), cpu, move || async move {
        let listener = TcpListener::from_std(std_listener).expect("listener");
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let zeros = zeros.clone();
            carmine_reactor::spawn(async move {
                let mut rbuf = BytesMut::with_capacity(READ_SPARE_MIN);
                let mut wbuf = BytesMut::with_capacity(READ_SPARE_MIN);
                loop {
                    while let Ok(Some(frame)) = try_decode_frame(&mut rbuf) {
                        let len = Request::decode(&frame).map(|r| reply_len(&r)).unwrap_or(0);
                        let payload = zeros.slice(..len);
                        encode_response(
                            &mut wbuf,
                            frame.header.request_id,
                            &Response::Pong { payload },
                        );
                    }
                    if !wbuf.is_empty() {
                        let (res, b) = write_all(&mut stream, std::mem::take(&mut wbuf)).await;
                        wbuf = b;
                        if res.is_err() {
                            return;
                        }
                    }
                    let (res, b) = read_some(&mut stream, rbuf, READ_SPARE_MIN).await;
                    rbuf = b;
                    if !matches!(res, Ok(n) if n > 0) {
                        return;
                    }
                }
            })
            .detach();
        }
    })?;
    Ok(addr)
}

/// Drives the trivial server at `depth` with `request_len`-byte requests.
pub async fn measure(
    addr: SocketAddr,
    request_len: usize,
    reply_len: usize,
    depth: usize,
    ramp: Duration,
    run: Duration,
) -> anyhow::Result<StepStats> {
    let conn = Connection::open(addr, depth.max(1)).await?;
    let mut payload = vec![0u8; request_len.max(4)];
    payload[..4].copy_from_slice(&(reply_len as u32).to_le_bytes());
    let req = Request::Ping {
        payload: Bytes::from(payload),
    };
    let bytes = request_len.max(reply_len) as u64;
    let stats = closed_loop(depth, ramp, run, bytes, |_, _| {
        let (conn, req) = (&conn, &req);
        async move { Io::of(conn.call(req).await.is_ok(), false) }
    })
    .await;
    conn.close();
    Ok(stats)
}
