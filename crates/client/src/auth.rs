//! The client side of the connection handshake (`carmine_proto::auth`): it checks the OSD's
//! proof before proving anything itself, so it never talks to a daemon without the key.

use crate::ClientError;
use bytes::BytesMut;
use carmine_proto::auth::{encode_proof, AuthKey, Challenge, Hello, NONCE_LEN};
use carmine_proto::{encode_frame, try_decode_frame, Frame, FrameKind, Opcode, Response};
use carmine_reactor::io::{read_some, write_all};
use carmine_reactor::TcpStream;
use std::net::SocketAddr;

/// Who this client says it is; bound into both proofs. Per-client keys will name themselves.
pub const CLIENT_ENTITY: &str = "client.admin";

fn failed(addr: SocketAddr, detail: impl Into<String>) -> ClientError {
    ClientError::Auth {
        addr,
        detail: detail.into(),
    }
}

pub(crate) async fn handshake(
    stream: &mut TcpStream,
    addr: SocketAddr,
    key: &AuthKey,
) -> Result<(), ClientError> {
    handshake_as(stream, addr, key, CLIENT_ENTITY).await
}

/// The handshake on a fresh connection, naming itself `entity` (an OSD connecting to another
/// says `osd.N`).
pub async fn handshake_as(
    stream: &mut TcpStream,
    addr: SocketAddr,
    key: &AuthKey,
    entity: &str,
) -> Result<(), ClientError> {
    let nonce: [u8; NONCE_LEN] = rand::random();
    let hello = Hello {
        nonce,
        entity: entity.into(),
    };
    let mut out = BytesMut::new();
    encode_frame(&mut out, FrameKind::Request, Opcode::Auth, 1, 0, |b| {
        hello.encode(b)
    });
    send(stream, addr, out).await?;
    let mut rbuf = BytesMut::new();
    let reply = read_frame(stream, addr, &mut rbuf).await?;
    check_ok(addr, &reply)?;
    let challenge = Challenge::decode(reply.payload).map_err(|e| failed(addr, e.to_string()))?;
    if !key.verify(true, &nonce, &challenge.nonce, entity, &challenge.proof) {
        return Err(failed(
            addr,
            "the OSD's proof does not match the cluster key: not this cluster's OSD, or \
             another key",
        ));
    }
    let proof = key.client_proof(&nonce, &challenge.nonce, entity);
    let mut out = BytesMut::new();
    encode_frame(&mut out, FrameKind::Request, Opcode::Auth, 2, 0, |b| {
        encode_proof(b, &proof)
    });
    send(stream, addr, out).await?;
    let done = read_frame(stream, addr, &mut rbuf).await?;
    check_ok(addr, &done)
}

/// An error reply (an OSD without a key, a refused proof) becomes an `Auth` error.
fn check_ok(addr: SocketAddr, f: &Frame) -> Result<(), ClientError> {
    if f.header.opcode != Opcode::Auth || f.header.kind != FrameKind::Response {
        return Err(failed(
            addr,
            "the OSD answered the handshake with something else",
        ));
    }
    if f.header.status == 0 {
        return Ok(());
    }
    Err(match Response::decode(f) {
        Ok(Err(reply)) => failed(addr, reply.message),
        _ => failed(addr, format!("status {}", f.header.status)),
    })
}

async fn send(stream: &mut TcpStream, addr: SocketAddr, out: BytesMut) -> Result<(), ClientError> {
    write_all(stream, out)
        .await
        .0
        .map_err(|e| ClientError::Disconnected {
            addr,
            reason: format!("during the handshake: {e}"),
            in_doubt: false,
        })
}

async fn read_frame(
    stream: &mut TcpStream,
    addr: SocketAddr,
    rbuf: &mut BytesMut,
) -> Result<Frame, ClientError> {
    let lost = |reason: String| ClientError::Disconnected {
        addr,
        reason,
        in_doubt: false,
    };
    loop {
        match try_decode_frame(rbuf) {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => {
                return Err(ClientError::Protocol {
                    addr,
                    detail: format!("during the handshake: {e}"),
                })
            }
        }
        let (res, buf) = read_some(stream, std::mem::take(rbuf), 4096).await;
        *rbuf = buf;
        match res {
            Ok(0) => return Err(lost("closed during the handshake".into())),
            Ok(_) => {}
            Err(e) => return Err(lost(format!("during the handshake: {e}"))),
        }
    }
}
