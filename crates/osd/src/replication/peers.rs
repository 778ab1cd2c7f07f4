//! Outgoing connections from one reactor to the reactors of other OSDs that serve the same
//! PGs. One connection per destination endpoint, opened on first use, authenticated as this
//! OSD (`osd.N`), written by one task per connection: senders append framed messages to its
//! outbox and ring, so a burst of replica messages leaves in one write. One way only: the
//! other side answers with messages on its own connection to us.
//!
//! A message is not guaranteed to arrive (the connection may break, the outbox may be full):
//! the PG protocol sends again what matters on its ticks, as it must over any network.

use bytes::BytesMut;
use carmine_proto::peer_parts::{self, PEER_MESSAGE_MAX};
use carmine_proto::{encode_frame, FrameKind, Opcode, FRAME_HEADER_LEN, FRAME_PAYLOAD_MAX};
use carmine_reactor::io::write_all;
use carmine_reactor::Doorbell;
use carmine_reactor::TcpStream;
use carmine_types::OsdId;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Bytes one destination may have waiting; past it, messages are dropped (and resent on the
/// protocol's next tick) rather than grow without bound behind a slow or dead peer.
const OUTBOX_BYTES_MAX: usize = 64 << 20;
/// After a failed connection attempt, no new one for this long (messages meanwhile drop).
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
/// Connecting and the handshake, together: a connection that lands in the backlog of a
/// listener nobody accepts on (a killed OSD's socket that the kernel has not torn down yet)
/// must not hold this destination's messages for ever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A write that sends nothing for this long (the peer stopped reading) ends the connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// At most one log line per this long about messages too large to send.
const OVERSIZE_SAID_EVERY: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Outbox {
    buf: RefCell<BytesMut>,
    bell: Doorbell,
    /// A task owns a connection (or is opening one) and drains `buf`.
    running: Cell<bool>,
    failed_at: Cell<Option<Instant>>,
}

pub(crate) struct Peers {
    me: OsdId,
    key: Option<carmine_proto::auth::AuthKey>,
    outboxes: RefCell<HashMap<SocketAddr, Rc<Outbox>>>,
    /// When a message too large for a frame was last logged.
    oversize_said: Cell<Option<Instant>>,
}

impl Peers {
    pub fn new(me: OsdId, key: Option<carmine_proto::auth::AuthKey>) -> Self {
        Peers {
            me,
            key,
            outboxes: RefCell::new(HashMap::new()),
            oversize_said: Cell::new(None),
        }
    }

    /// Queues one `Peer` frame whose payload `fill` writes, for `to`.
    pub fn send(&self, to: SocketAddr, fill: impl FnOnce(&mut BytesMut)) {
        let outbox = self.outboxes.borrow_mut().entry(to).or_default().clone();
        if outbox
            .failed_at
            .get()
            .is_some_and(|t| t.elapsed() < RECONNECT_PAUSE)
            || outbox.buf.borrow().len() >= OUTBOX_BYTES_MAX
        {
            tracing::debug!(%to, "peer message dropped: no connection, or a full outbox");
            return;
        }
        // A message larger than a frame goes in parts (a PG's object listing, an object copy
        // with a large omap); one larger than a receiver takes in parts is never sent: it
        // would close the connection, which every PG between the two reactors shares, and the
        // protocol would send it again on its next tick. (Its PG waits, and this says why.)
        let mut oversized = None;
        {
            let mut buf = outbox.buf.borrow_mut();
            let start = buf.len();
            let mut whole = None;
            encode_frame(&mut buf, FrameKind::Request, Opcode::Peer, 0, 0, |b| {
                fill(b);
                let len = b.len() - start - FRAME_HEADER_LEN;
                if len > FRAME_PAYLOAD_MAX as usize {
                    whole = Some(b.split_off(start + FRAME_HEADER_LEN));
                }
            });
            if let Some(message) = whole {
                buf.truncate(start);
                if message.len() <= PEER_MESSAGE_MAX {
                    peer_parts::encode_parts(&mut buf, &message);
                } else {
                    oversized = Some(message.len());
                }
            }
        }
        if let Some(len) = oversized {
            let said = self.oversize_said.get();
            if said.is_none_or(|t| t.elapsed() >= OVERSIZE_SAID_EVERY) {
                self.oversize_said.set(Some(Instant::now()));
                tracing::error!(%to, len, max = PEER_MESSAGE_MAX,
                    "a message to another OSD is larger than one may be, even in parts: not \
                     sent (a PG listing more objects than one message holds cannot peer)");
            }
            return;
        }
        outbox.bell.ring();
        if !outbox.running.replace(true) {
            let key = self.key.clone();
            let me = self.me;
            carmine_reactor::spawn(async move {
                if let Err(e) = drain(to, me, key, &outbox).await {
                    tracing::info!(%to, "peer connection ended: {e}");
                    outbox.failed_at.set(Some(Instant::now()));
                }
                // What was queued for a dead connection is lost; the protocol resends.
                outbox.buf.borrow_mut().clear();
                outbox.running.set(false);
            })
            .detach();
        }
    }
}

async fn drain(
    to: SocketAddr,
    me: OsdId,
    key: Option<carmine_proto::auth::AuthKey>,
    outbox: &Outbox,
) -> Result<(), String> {
    let mut stream = carmine_reactor::timeout(CONNECT_TIMEOUT, connect(to, me, key))
        .await
        .map_err(|_| format!("not connected and authenticated within {CONNECT_TIMEOUT:?}"))??;
    let mut spare = BytesMut::new();
    loop {
        if outbox.buf.borrow().is_empty() {
            outbox.bell.wait().await;
            continue;
        }
        let buf = std::mem::replace(&mut *outbox.buf.borrow_mut(), std::mem::take(&mut spare));
        let (res, mut buf) = carmine_reactor::timeout(WRITE_TIMEOUT, write_all(&mut stream, buf))
            .await
            .map_err(|_| format!("the peer took nothing for {WRITE_TIMEOUT:?}"))?;
        res.map_err(|e| format!("write: {e}"))?;
        buf.clear();
        spare = buf;
    }
}

async fn connect(
    to: SocketAddr,
    me: OsdId,
    key: Option<carmine_proto::auth::AuthKey>,
) -> Result<TcpStream, String> {
    let mut stream = TcpStream::connect(to)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    if stream.local_addr().ok() == Some(to) {
        return Err("connected to itself: nothing listens there".into());
    }
    let _ = stream.set_nodelay(true);
    if let Some(key) = &key {
        carmine_client::handshake_as(&mut stream, to, key, &format!("osd.{me}"))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_larger_than_a_frame_goes_in_parts_and_one_too_large_for_parts_is_dropped() {
        let peers = Peers::new(1, None);
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let outbox = peers.outboxes.borrow_mut().entry(to).or_default().clone();
        // As if a task drained this destination already: nothing is spawned here.
        outbox.running.set(true);
        peers.send(to, |b| b.extend_from_slice(b"small"));
        let before = outbox.buf.borrow().len();
        assert_eq!(before, FRAME_HEADER_LEN + 5);
        let big: Vec<u8> = (0..FRAME_PAYLOAD_MAX as usize + 1000)
            .map(|i| i as u8)
            .collect();
        peers.send(to, |b| b.extend_from_slice(&big));
        peers.send(to, |b| {
            b.extend_from_slice(&vec![7u8; PEER_MESSAGE_MAX + 1]);
        });
        assert!(peers.oversize_said.get().is_some());
        peers.send(to, |b| b.extend_from_slice(b"next"));
        // What the receiver sees: the small message, the big one whole, the next one.
        let mut stream = outbox.buf.borrow().clone();
        let mut assembly = peer_parts::Assembly::default();
        let mut got = Vec::new();
        while let Some(f) = carmine_proto::try_decode_frame(&mut stream).unwrap() {
            if let Some(f) = peer_parts::assemble(&mut assembly, f).unwrap() {
                assert_eq!(f.header.opcode, Opcode::Peer);
                got.push(f.payload);
            }
        }
        assert!(stream.is_empty());
        assert_eq!(
            got.len(),
            3,
            "the message too large even for parts was queued"
        );
        assert_eq!(&got[0][..], b"small");
        assert_eq!(&got[1][..], &big[..]);
        assert_eq!(&got[2][..], b"next");
    }
}
