//! The server side of the connection handshake (`carmine_proto::auth`): on a cluster with a
//! key, nothing a peer sends is read as a request until it has proved it holds the key, and it
//! has seen that this OSD does. One clear error, then the connection closes.

use bytes::BytesMut;
use carmine_proto::auth::{decode_proof, AuthKey, Challenge, Hello, NONCE_LEN};
use carmine_proto::{
    encode_error, encode_frame, peek_frame_header, try_decode_frame, ErrorReply, Frame, FrameKind,
    Opcode, Status,
};
use carmine_reactor::io::{read_some, write_all};
use carmine_reactor::TcpStream;
use std::time::Duration;

/// How long a peer has to complete the handshake: an unauthenticated connection holds a slot.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs the handshake on a new connection; returns the peer's entity name, or why it was
/// refused (after telling the peer).
pub(crate) async fn authenticate(stream: &mut TcpStream, key: &AuthKey) -> Result<String, String> {
    match carmine_reactor::timeout(HANDSHAKE_TIMEOUT, handshake(stream, key)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")),
    }
}

async fn handshake(stream: &mut TcpStream, key: &AuthKey) -> Result<String, String> {
    let mut rbuf = BytesMut::new();
    let hello = read_frame(stream, &mut rbuf).await?;
    let id = hello.header.request_id;
    let hello = match Hello::decode(hello.payload) {
        Ok(h) => h,
        Err(e) => return refuse(stream, id, Opcode::Auth, &e.to_string()).await,
    };
    let nonce: [u8; NONCE_LEN] = rand::random();
    let challenge = Challenge {
        nonce,
        proof: key.server_proof(&hello.nonce, &nonce, &hello.entity),
    };
    let mut out = BytesMut::new();
    encode_frame(&mut out, FrameKind::Response, Opcode::Auth, id, 0, |b| {
        challenge.encode(b)
    });
    send(stream, out).await?;
    let proof = read_frame(stream, &mut rbuf).await?;
    let id = proof.header.request_id;
    let ok = decode_proof(proof.payload)
        .is_ok_and(|p| key.verify(false, &hello.nonce, &nonce, &hello.entity, &p));
    if !ok {
        return refuse(
            stream,
            id,
            Opcode::Auth,
            "authentication failed: wrong key (or a replayed handshake)",
        )
        .await;
    }
    if !rbuf.is_empty() {
        return Err("the peer sent requests before the handshake completed".into());
    }
    let mut out = BytesMut::new();
    encode_frame(&mut out, FrameKind::Response, Opcode::Auth, id, 0, |_| {});
    send(stream, out).await?;
    Ok(hello.entity)
}

async fn refuse(
    stream: &mut TcpStream,
    id: u64,
    opcode: Opcode,
    why: &str,
) -> Result<String, String> {
    let mut out = BytesMut::new();
    encode_error(
        &mut out,
        id,
        opcode,
        &ErrorReply {
            status: Status::AuthFailed,
            op_index: None,
            message: why.to_owned(),
        },
    );
    let _ = send(stream, out).await;
    Err(why.to_owned())
}

async fn send(stream: &mut TcpStream, out: BytesMut) -> Result<(), String> {
    write_all(stream, out)
        .await
        .0
        .map_err(|e| format!("write: {e}"))
}

/// Handshake frames are a few dozen bytes: a peer that has not authenticated may not make the
/// OSD buffer more (a full request frame is megabytes).
const HANDSHAKE_BYTES_MAX: usize = 1024;

/// The next frame on `stream` if it is a handshake frame (bytes after it stay in `rbuf`);
/// anything else is refused by its header, before its payload is buffered.
async fn read_frame(stream: &mut TcpStream, rbuf: &mut BytesMut) -> Result<Frame, String> {
    loop {
        match peek_frame_header(rbuf) {
            Ok(Some(h)) if h.opcode != Opcode::Auth || h.kind != FrameKind::Request => {
                let why = "authentication required: this cluster has a key, and every \
                           connection must start with the handshake (connect with the \
                           cluster key)";
                refuse(stream, h.request_id, h.opcode, why).await?;
            }
            Ok(Some(h)) if h.payload_len as usize > HANDSHAKE_BYTES_MAX => {
                refuse(stream, h.request_id, h.opcode, "handshake frame too large").await?;
            }
            Ok(Some(_)) => {
                if let Some(f) = try_decode_frame(rbuf)
                    .map_err(|e| format!("bad frame during the handshake: {e}"))?
                {
                    return Ok(f);
                }
            }
            Ok(None) => {}
            Err(e) => return Err(format!("bad frame during the handshake: {e}")),
        }
        let (res, buf) = read_some(stream, std::mem::take(rbuf), HANDSHAKE_BYTES_MAX).await;
        *rbuf = buf;
        match res {
            Ok(0) => return Err("peer closed during the handshake".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}
